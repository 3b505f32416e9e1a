package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/remote"
)

// PeerPolicy is who may use the control socket. Whoever may use it can launch an unconfined
// session, that is, act as host root: so only root and the socket group's members may, and
// never a session's own process, whatever its uid.
type PeerPolicy struct {
	// Group is the socket's group, whose members may connect besides root; nil for none.
	Group *SocketGroup
	// Sessions tells a session's processes from others.
	Sessions SessionProcs
}

// SocketGroup is the group the control socket is opened to.
type SocketGroup struct {
	Name string
	GID  uint32
}

// SessionProcs tells whether a process is a session's: in a session's cgroup, or below one
// of the helpers every session runs under. Ancestry covers what the cgroup cannot: plain
// sessions have no cgroup of their own but run under roost-init, a child subreaper, so
// their orphans stay below it; a sealed or scoped session's processes cannot leave a pid
// namespace whose init is roost-init.
type SessionProcs struct {
	// CgroupParents hold every session's cgroup (the configured parent, and /roost for
	// sessions started before it was configurable); a process in a cgroup strictly beneath
	// one is a session's.
	CgroupParents []string
	// Helpers are the comm names of the processes sessions run under.
	Helpers []string
	// HelperBinary, when set, is the binary that plays the helpers: a process running it is
	// one, whatever its comm. The helpers start each other through /proc/self/exe, which
	// makes their comm "exe", and so does roostd's own binary when it plays roost-init.
	HelperBinary string
}

// maxAncestry bounds the walk up the parent chain; no real tree is this deep, and a loop
// made of recycled pids must end.
const maxAncestry = 4096

// NewSessionProcs returns roostd's own: the cgroup parents sessions' cgroups live under
// (containment's Cgroups.Parents), the helpers' names, and the binary that plays
// them (roostd's init binary, or /proc/self/exe when roostd plays roost-init itself).
func NewSessionProcs(helperBinary string, cgroupParents []string) SessionProcs {
	return SessionProcs{
		CgroupParents: cgroupParents,
		Helpers:       []string{roostinit.InitName, roostinit.ExecName},
		HelperBinary:  helperBinary,
	}
}

// errAncestryChanged is a parent that exited during the walk: the chain is read again.
var errAncestryChanged = errors.New("its ancestry changed while roostd read it")

// errPeerGone is the process judged having ended: whatever holds its pid next is not it.
var errPeerGone = errors.New("it ended before roostd could check it")

// Of says why pid is a session's process, or "" when it is not. An error means it could
// not be told, and the caller must refuse.
//
// The answer is only as good as pid: the caller must confirm afterwards that the process
// it meant still holds pid (a pidfd). Each ancestor is confirmed here: after the walk every
// link is read again from the top down, so each parent was alive, and the same process,
// from when it was found to when its child's link was read again.
func (s SessionProcs) Of(pid int) (string, error) {
	var helper os.FileInfo
	if s.HelperBinary != "" {
		fi, err := os.Stat(s.HelperBinary)
		if err != nil {
			return "", fmt.Errorf("identifying the session helper binary: %w", err)
		}
		helper = fi
	}
	for range 3 {
		reason, chain, err := s.walk(pid, helper)
		if errors.Is(err, errAncestryChanged) {
			continue
		}
		if err != nil || reason != "" {
			return reason, err
		}
		if err := confirmChain(chain); errors.Is(err, errAncestryChanged) {
			continue
		} else if err != nil {
			return "", err
		}
		return "", nil
	}
	return "", errAncestryChanged
}

// walk reads pid and its ancestors up to the top of the tree. It returns the first sign
// of a session, or the chain of pids it read (pid first) when there is none.
func (s SessionProcs) walk(pid int, helper os.FileInfo) (string, []int, error) {
	var parents []string
	for _, p := range s.CgroupParents {
		parents = append(parents, strings.TrimSuffix(path.Clean(p), "/")+"/")
	}
	var chain []int
	for p := pid; p > 0; {
		if len(chain) == maxAncestry {
			return "", nil, fmt.Errorf("its ancestry is deeper than %d processes", maxAncestry)
		}
		who := fmt.Sprintf("pid %d", pid)
		if p != pid {
			who = fmt.Sprintf("pid %d's ancestor pid %d", pid, p)
		}
		comm, ppid, err := readStat(p)
		if err != nil {
			return "", nil, vanished(p, pid, err)
		}
		for _, h := range s.Helpers {
			if comm == h {
				return fmt.Sprintf("%s is %s", who, h), nil, nil
			}
		}
		if helper != nil {
			// A kernel thread has no executable, and one that exited is caught when the
			// chain is confirmed; neither is the helper binary.
			if fi, err := os.Stat(fmt.Sprintf("/proc/%d/exe", p)); err == nil && os.SameFile(fi, helper) {
				name := s.HelperBinary
				// /proc/self/exe (roostd playing roost-init) reads better as what it links to.
				if target, err := os.Readlink(name); err == nil {
					name = target
				}
				return fmt.Sprintf("%s runs the session helper binary %s", who, name), nil, nil
			}
		}
		if len(parents) > 0 {
			cgroups, err := readCgroups(p)
			if err != nil {
				return "", nil, vanished(p, pid, err)
			}
			for _, cg := range cgroups {
				// Every hierarchy counts: on a hybrid host the unified one is joined too,
				// and on a v1 host it is all there is.
				for _, parent := range parents {
					if strings.HasPrefix(cg, parent) && len(cg) > len(parent) {
						return fmt.Sprintf("%s is in session cgroup %s", who, cg), nil, nil
					}
				}
			}
		}
		chain = append(chain, p)
		p = ppid
	}
	return "", chain, nil
}

// vanished is an error reading process p on behalf of peer: an ancestor that exited sends
// the walk round again (its children have a new parent); the peer itself gone is final.
func vanished(p, peer int, err error) error {
	switch {
	case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESRCH):
		return fmt.Errorf("reading pid %d: %w", p, err)
	case p == peer:
		return fmt.Errorf("%w (%w)", errPeerGone, err)
	default:
		return errAncestryChanged
	}
}

// confirmChain reads each link of chain again, top down: a parent still a child's parent
// after its own link was confirmed was alive throughout, so what was read of it was its own.
func confirmChain(chain []int) error {
	for i := len(chain) - 2; i >= 0; i-- {
		_, ppid, err := readStat(chain[i])
		if err != nil {
			return vanished(chain[i], chain[0], err)
		}
		if ppid != chain[i+1] {
			return errAncestryChanged
		}
	}
	return nil
}

// readStat returns a process's comm and parent pid from /proc/<pid>/stat, in one read.
func readStat(pid int) (string, int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, err
	}
	// comm may hold spaces and parentheses: it runs from the first '(' to the last ')'.
	s := string(data)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	fields := strings.Fields(s[closing+1:])
	if len(fields) < 2 {
		return "", 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return "", 0, fmt.Errorf("/proc/%d/stat: parent pid: %w", pid, err)
	}
	return s[open+1 : closing], ppid, nil
}

// readCgroups returns the cgroup paths of a process, one per hierarchy.
func readCgroups(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, err
	}
	var out []string
	for line := range strings.Lines(string(data)) {
		if parts := strings.SplitN(strings.TrimSuffix(line, "\n"), ":", 3); len(parts) == 3 {
			out = append(out, parts[2])
		}
	}
	return out, nil
}

// readGroups returns a process's supplementary groups.
func readGroups(pid int) ([]uint32, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	for line := range strings.Lines(string(data)) {
		rest, ok := strings.CutPrefix(line, "Groups:")
		if !ok {
			continue
		}
		var groups []uint32
		for _, f := range strings.Fields(rest) {
			g, err := strconv.ParseUint(f, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/status: group %q: %w", pid, f, err)
			}
			groups = append(groups, uint32(g))
		}
		return groups, nil
	}
	return nil, fmt.Errorf("/proc/%d/status: no Groups line", pid)
}

// peerInfo is what the handshake learned of a connection's peer, and its verdict.
type peerInfo struct {
	credentials.CommonAuthInfo
	PID int
	// UID and GID are the peer's when it connected; -1 when they could not be read.
	UID, GID int64
	// Pidfd says the pid was held by a pidfd while it was checked, so it could not have
	// been recycled; false on kernels before 6.5.
	Pidfd bool
	// Reason is why the peer is refused; "" when it is served.
	Reason string
}

var _ credentials.AuthInfo = (*peerInfo)(nil)

func (*peerInfo) AuthType() string { return peerProtocol }

// refusal is the error every RPC of a refused peer ends with.
func (p *peerInfo) refusal() error {
	if p.Reason == "" {
		return nil
	}
	return fmt.Errorf("%s: %w", p.Reason, errdefs.ErrPermissionDenied)
}

const peerProtocol = "roost-peer"

// peerCreds judges each connection's peer as the connection is accepted. It refuses
// nothing itself: a refused connection is served, and every RPC on it fails with why
// (see peerRefusal), which a client can show; a failed handshake would only look like a
// daemon that is down.
type peerCreds struct {
	policy PeerPolicy
	log    *slog.Logger
}

var _ credentials.TransportCredentials = (*peerCreds)(nil)

func (c *peerCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := c.policy.judge(conn)
	if info.Reason != "" {
		c.log.Warn("refused a control connection", "pid", info.PID, "uid", info.UID, "reason", info.Reason, "pidfd", info.Pidfd)
	} else if !info.Pidfd {
		c.log.Debug("served a control connection checked without a pidfd (kernel before 6.5)", "pid", info.PID, "uid", info.UID)
	}
	return conn, info, nil
}

// ClientHandshake is never used: these credentials are the server's.
func (*peerCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("roost peer credentials only serve")
}

func (*peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: peerProtocol}
}

func (c *peerCreds) Clone() credentials.TransportCredentials {
	cp := *c
	cp.policy.Sessions.Helpers = append([]string(nil), c.policy.Sessions.Helpers...)
	return &cp
}

func (*peerCreds) OverrideServerName(string) error { return nil }

// judge reads the peer of conn and decides whether it is served. Whatever cannot be read
// or confirmed is refused.
func (p PeerPolicy) judge(conn net.Conn) *peerInfo {
	// A unix socket's bytes never leave the kernel (as gRPC's local credentials hold).
	info := &peerInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, UID: -1, GID: -1}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		info.Reason = fmt.Sprintf("roostd cannot read the credentials of a %T connection", conn)
		return info
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		info.Reason = fmt.Sprintf("roostd cannot read the peer's credentials: %v", err)
		return info
	}
	var cred *unix.Ucred
	pidfd := -1
	var credErr, pidfdErr error
	if err := raw.Control(func(fd uintptr) {
		if cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); credErr != nil {
			return
		}
		pidfd, pidfdErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil && credErr == nil {
		credErr = err
	}
	if credErr != nil {
		info.Reason = fmt.Sprintf("roostd cannot read the peer's credentials: %v", credErr)
		return info
	}
	info.PID, info.UID, info.GID = int(cred.Pid), int64(cred.Uid), int64(cred.Gid)
	switch {
	case pidfdErr == nil:
		defer unix.Close(pidfd)
		info.Pidfd = true
	case errors.Is(pidfdErr, unix.ENOPROTOOPT):
		// Before Linux 6.5 there is only the pid: a peer that exits, and whose pid is taken
		// while it is read, would be judged as the new holder. The risk is left, and logged.
	default:
		info.Reason = fmt.Sprintf("roostd cannot hold the peer's pid %d: %v", info.PID, pidfdErr)
		return info
	}
	if info.PID == 0 {
		info.Reason = "the peer is in a pid namespace roostd cannot see into"
		return info
	}

	member := cred.Uid == 0
	if !member && p.Group != nil {
		member = cred.Gid == p.Group.GID
		if !member {
			groups, err := readGroups(info.PID)
			if err != nil {
				info.Reason = fmt.Sprintf("roostd cannot read the groups of pid %d: %v", info.PID, err)
				return info
			}
			member = slices.Contains(groups, p.Group.GID)
		}
	}
	sessionReason, err := p.Sessions.Of(info.PID)
	switch {
	case errors.Is(err, errPeerGone):
		info.Reason = fmt.Sprintf("pid %d ended before roostd could check it", info.PID)
		return info
	case err != nil:
		info.Reason = fmt.Sprintf("roostd cannot tell whether pid %d is a session's: %v", info.PID, err)
		return info
	case sessionReason != "":
		info.Reason = fmt.Sprintf("roostd serves no session's processes (%s)", sessionReason)
		return info
	}
	// Last: everything above was read of whatever held the pid, and only now is it known
	// to be the peer.
	if info.Pidfd {
		if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
			info.Reason = fmt.Sprintf("pid %d ended before roostd could check it: %v", info.PID, err)
			return info
		}
	}
	if !member {
		if p.Group == nil {
			info.Reason = fmt.Sprintf("uid %d is not root, and the socket has no group", cred.Uid)
		} else {
			info.Reason = fmt.Sprintf("uid %d is neither root nor in the socket group %s", cred.Uid, p.Group.Name)
		}
	}
	return info
}

// peerRefusal is why the caller of ctx is not served method, or nil. A connection the peer
// credentials did not judge (another listener, an in-memory one) is refused too.
//
// A remote caller (pkg/remote) is the exception: the remote listener let it in by its
// certificate and role before the call reached the gRPC server, and the socket's checks
// (root or the socket group, never a session's process) are of a local process, which it
// is not. It is never taken for root: its role is held to the method here again.
func peerRefusal(ctx context.Context, method string) error {
	if c, ok := remote.CallerFrom(ctx); ok {
		if !remote.Allowed(c.Role, method) {
			return fmt.Errorf("%s may not call %s: %w", c, method, errdefs.ErrPermissionDenied)
		}
		return nil
	}
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return fmt.Errorf("roostd serves only callers it has checked, and this one has no peer: %w", errdefs.ErrPermissionDenied)
	}
	info, ok := pr.AuthInfo.(*peerInfo)
	if !ok {
		return fmt.Errorf("roostd serves only callers it has checked, and this connection was not: %w", errdefs.ErrPermissionDenied)
	}
	return info.refusal()
}

// ForwardedCaller is who called, as a call forwarded to another node of the fleet names
// them (pkg/fleet/route): a remote client by its Common Name and role; a caller on this
// node's socket, which the peer check let in as root or the socket group, as "uid N on node
// NODE's socket", an operator. A caller the peer check did not judge has no name to forward.
func ForwardedCaller(node string) func(context.Context) (string, remote.Role, error) {
	return func(ctx context.Context) (string, remote.Role, error) {
		if c, ok := remote.CallerFrom(ctx); ok {
			return c.CommonName, c.Role, nil
		}
		if pr, ok := peer.FromContext(ctx); ok {
			if info, ok := pr.AuthInfo.(*peerInfo); ok && info.Reason == "" && info.UID >= 0 {
				return fmt.Sprintf("uid %d on node %s's socket", info.UID, node), remote.Operator, nil
			}
		}
		return "", "", fmt.Errorf("roostd knows no caller of this call to forward: %w", errdefs.ErrPermissionDenied)
	}
}

// The peer interceptors come first in their chains: a refused caller reaches nothing else.
func peerUnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := peerRefusal(ctx, info.FullMethod); err != nil {
		return nil, ToStatus(err)
	}
	return handler(ctx, req)
}

func peerStreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := peerRefusal(ss.Context(), info.FullMethod); err != nil {
		return ToStatus(err)
	}
	return handler(srv, ss)
}
