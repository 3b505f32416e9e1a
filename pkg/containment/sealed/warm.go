package sealed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/manifest"
)

// WarmPrefix begins the id of every sandbox made ahead of its session: a name no session
// id takes, so a restarted daemon tells an unclaimed sandbox from a session's container.
const WarmPrefix = cgroups.SandboxPrefix

// Sandbox is a sealed container made before its session: user, pid, mount, network, IPC,
// UTS and cgroup namespaces, cgroup, seccomp filter, the shared root with /proc, /dev,
// /tmp and /run, roost-init as PID 1 and roost-exec below it, both waiting for their specs
// (see roostinit.WarmArg). What only a session has (its workdir, capsule, home and task) is
// mounted in when a session claims it, its cgroup limits set, and its command handed over:
// from there it is that session's container, and it ends with it. A sandbox serves one
// session, never two.
type Sandbox struct {
	ID    string
	Shape WarmShape
	IDs   containment.IDs
	// NetNS is the network namespace it joined, pinned by the caller.
	NetNS string
	// Records is the records directory roost-init holds open: the claiming session's
	// records directory must be this one (the caller renames it into place).
	Records string

	io        *containment.InitIO
	container *lazyContainer
	// config is what the container was made with: a claim compares the session's limits
	// with it rather than read the container's state.
	config    *configs.Config
	proc      *libcontainer.Process
	initPID   int
	initStart uint64
}

// WarmShape is what a pool's sandboxes are made for: a sealed capsule's policy, and how
// explain names it.
type WarmShape struct {
	// Name reads in "warm sandboxes are made with <Name>'s seccomp filter".
	Name   string
	Policy *manifest.Policy
}

// DefaultWarmShape is a sealed capsule's defaults. A session whose container differs from
// a shape's in anything a sandbox fixes ahead (rlimits above it, its seccomp variant,
// host_read, workdir_exec) does not fit it.
func DefaultWarmShape() WarmShape {
	p := manifest.Lower(&manifest.Manifest{Name: "warm", Version: "0.0.0", Run: manifest.Run{Command: []string{"/usr/bin/true"}}})
	p.Containment = manifest.Sealed
	return WarmShape{Name: DefaultWarmShapeName, Policy: &p}
}

// DefaultWarmShapeName is DefaultWarmShape's name.
const DefaultWarmShapeName = "a default capsule"

// sessionMount says whether a mount of a sealed spec is the session's own, mounted into a
// sandbox when a session claims it rather than when the sandbox is made.
func sessionMount(dest string) bool {
	// The system trees are the session's too: its view of them is its allowlist's; and so is
	// its passwd, which names the login shell that view holds.
	return dest == Work || strings.HasPrefix(dest, Work+"/") || dest == Capsule ||
		dest == Home || dest == TaskPath || dest == PasswdPath || inSystemTrees(dest)
}

// Prepare makes a sandbox of the shape for a session to come: id begins with WarmPrefix,
// ids is the uid range it maps (held for it by the caller), netns the network namespace it
// joins, records the directory roost-init will write the claiming session's output and end
// into.
func (r *Runtime) Prepare(ctx context.Context, shape WarmShape, id string, ids containment.IDs, netns, records string) (_ *Sandbox, retErr error) {
	if !strings.HasPrefix(id, WarmPrefix) {
		return nil, fmt.Errorf("sandbox id %q does not begin with %q", id, WarmPrefix)
	}
	layout := r.Layout(id, "", "")
	layout.IDs, layout.NetNS = ids, netns
	layout.HostRead = shape.Policy.Filesystem.HostRead
	defer func() {
		if retErr != nil {
			_ = r.Release(id)
		}
	}()
	// The claim renames a root composed for the sandbox to the session's.
	if err := r.ownRoot(id, &layout); err != nil {
		return nil, fmt.Errorf("composing the sandbox's root: %w", err)
	}
	full, err := OCISpec(layout, shape.Policy)
	if err != nil {
		return nil, err
	}
	spec := withoutSessionMounts(full)
	config, err := r.config(id, spec)
	if err != nil {
		return nil, err
	}
	if err := os.Lchown(records, int(ids.First), int(ids.First)); err != nil {
		return nil, fmt.Errorf("records directory: %w", err)
	}
	io, err := containment.OpenInitIO(records)
	if err != nil {
		return nil, err
	}
	container, proc, err := r.run(ctx, id, config, memfdNoExec(spec), io, roostinit.WarmArg)
	if err != nil {
		io.Close()
		return nil, err
	}
	return &Sandbox{ID: id, Shape: shape, IDs: ids, NetNS: netns, Records: records, io: io,
		container: container, config: config, proc: proc, initPID: container.initPID, initStart: container.initStart}, nil
}

// Alive says whether the sandbox's init still waits for a session.
func (sb *Sandbox) Alive() bool {
	st, err := containment.StartTime(sb.initPID)
	return err == nil && st == sb.initStart
}

// Discard ends a sandbox no session claimed and frees what it holds but its network
// namespace and records directory, which are the caller's.
func (r *Runtime) Discard(sb *Sandbox) error {
	sb.io.Close()
	sb.container.signal(syscall.SIGKILL)
	if sb.proc != nil {
		_, _ = sb.proc.Wait()
	}
	return r.Release(sb.ID)
}

// Fits says why a session with policy p (and a WASM runner when wasm) would not run in a
// sandbox of the shape made by Prepare; nil when it would run exactly as in a container
// made for it. The answer depends on the policies alone, and a host sees few: it is kept.
func (r *Runtime) Fits(shape WarmShape, p *manifest.Policy, wasm bool) error {
	key, err := json.Marshal(struct {
		Shape WarmShape
		P     *manifest.Policy
		Wasm  bool
	}{shape, p, wasm})
	if err != nil {
		return err
	}
	r.fitsMu.Lock()
	verdict, ok := r.fits[string(key)]
	r.fitsMu.Unlock()
	if ok {
		return verdict
	}
	verdict = r.fitsAfresh(shape, p, wasm)
	r.fitsMu.Lock()
	if r.fits == nil || len(r.fits) >= maxFitsKept {
		r.fits = map[string]error{}
	}
	r.fits[string(key)] = verdict
	r.fitsMu.Unlock()
	return verdict
}

// maxFitsKept bounds the policies Fits remembers: past it, it starts over.
const maxFitsKept = 256

func (r *Runtime) fitsAfresh(shape WarmShape, p *manifest.Policy, wasm bool) error {
	layout := r.Layout(WarmPrefix+"x", "/w", "/c")
	layout.IDs = containment.IDs{First: 1, Size: 1}
	layout.HostRead = shape.Policy.Filesystem.HostRead
	want, err := OCISpec(layout, shape.Policy)
	if err != nil {
		return err
	}
	layout.Home, layout.Task = "/h", "/t"
	if wasm {
		layout.Runner, layout.WasmModule = "/r", "/m"
	}
	layout.HostRead = p.Filesystem.HostRead
	got, err := OCISpec(layout, p)
	if err != nil {
		return err
	}
	if err := sameSandbox(want, got); err != nil {
		return &NotWarmError{Field: err.Field, Shape: shape.Name}
	}
	return nil
}

// sameSandbox says where two specs differ in what a sandbox fixes before its session.
// roost-exec sets the session's rlimits on itself before the program, as it does cold: it
// can lower the sandbox's, never raise them.
func sameSandbox(sandbox, session *specs.Spec) *NotWarmError {
	hard := map[string]uint64{}
	for _, rl := range sandbox.Process.Rlimits {
		hard[rl.Type] = rl.Hard
	}
	for _, rl := range session.Process.Rlimits {
		if h, ok := hard[rl.Type]; ok && rl.Hard > h {
			return &NotWarmError{Field: "process.rlimits[" + rl.Type + "]"}
		}
	}
	a, b := sandboxShape(sandbox), sandboxShape(session)
	if where := firstDifference(a, b, ""); where != "" {
		return &NotWarmError{Field: where}
	}
	return nil
}

// NotWarmError names the part of a session's container a sandbox made ahead, of the named
// shape, would get wrong.
type NotWarmError struct{ Field, Shape string }

func (e *NotWarmError) Error() string {
	what := "container"
	for _, c := range []struct{ prefix, what string }{
		{"linux.seccomp", "seccomp filter (network.unix_sockets)"},
		{"process.rlimits", "rlimits, which a session can only lower (resources.max_open_files, max_file_size_bytes, cpu_seconds, max_processes)"},
		{"annotations", "memfd setting (vm.memfd_noexec, which filesystem.workdir_exec leaves at the host's)"},
		{"mounts[/dev/shm]", "noexec trees (filesystem.workdir_exec)"},
		{"mounts", "root (filesystem.host_read, a WASM runner)"},
		{"root", "root (filesystem.host_read, a WASM runner)"},
	} {
		if strings.HasPrefix(e.Field, c.prefix) {
			what = c.what
			break
		}
	}
	return "warm sandboxes are made with " + e.Shape + "'s " + what + ", and this one's differs (at " + e.Field + ")"
}

// sandboxShape is a spec without what a claim sets: the session's mounts, uid map,
// cgroup path and limits, /tmp's size, network namespace path, init's arguments and the
// rlimits roost-exec sets (see sameSandbox).
func sandboxShape(s *specs.Spec) any {
	c, _ := splitMounts(s)
	c.Process.Args, c.Process.Rlimits = nil, nil
	for i, m := range c.Mounts {
		if m.Destination == "/tmp" {
			c.Mounts[i].Options = slices.DeleteFunc(slices.Clone(m.Options), func(o string) bool { return strings.HasPrefix(o, "size=") })
		}
	}
	c.Linux.UIDMappings, c.Linux.GIDMappings = nil, nil
	c.Linux.CgroupsPath, c.Linux.Resources = "", nil
	for i := range c.Linux.Namespaces {
		c.Linux.Namespaces[i].Path = ""
	}
	data, _ := json.Marshal(c)
	var out any
	_ = json.Unmarshal(data, &out)
	return out
}

// firstDifference is the JSON path of the first place a and b differ; "" when equal.
// Mounts are told apart by destination.
func firstDifference(a, b any, at string) string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			return at
		}
		keys := make([]string, 0, len(av)+len(bv))
		for k := range av {
			keys = append(keys, k)
		}
		for k := range bv {
			if _, ok := av[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			if d := firstDifference(av[k], bv[k], strings.TrimPrefix(at+"."+k, ".")); d != "" {
				return d
			}
		}
		return ""
	case []any:
		bv, ok := b.([]any)
		if !ok {
			return at
		}
		for i := range max(len(av), len(bv)) {
			var x, y any
			if i < len(av) {
				x = av[i]
			}
			if i < len(bv) {
				y = bv[i]
			}
			name := fmt.Sprintf("%s[%d]", at, i)
			if m, ok := x.(map[string]any); ok && m["destination"] != nil {
				name = fmt.Sprintf("%s[%v]", at, m["destination"])
			} else if m, ok := y.(map[string]any); ok && m["destination"] != nil {
				name = fmt.Sprintf("%s[%v]", at, m["destination"])
			}
			if d := firstDifference(x, y, name); d != "" {
				return d
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(a, b) {
			return at
		}
		return ""
	}
}

// splitMounts is a deep copy of s without the session's own mounts, and those mounts in
// order.
func splitMounts(s *specs.Spec) (*specs.Spec, []specs.Mount) {
	var c specs.Spec
	data, _ := json.Marshal(s)
	_ = json.Unmarshal(data, &c)
	c.Mounts = slices.DeleteFunc(c.Mounts, func(m specs.Mount) bool { return sessionMount(m.Destination) })
	return &c, sessionMounts(s)
}

// withoutSessionMounts is s without the session's own mounts: a copy of its mount list, the
// rest shared with s. A deep copy goes through JSON, seccomp rules and all, about a
// millisecond here; a sandbox is made from a spec nothing else uses.
func withoutSessionMounts(s *specs.Spec) *specs.Spec {
	c := *s
	c.Mounts = slices.DeleteFunc(slices.Clone(s.Mounts), func(m specs.Mount) bool { return sessionMount(m.Destination) })
	return &c
}

// sessionMounts is the session's own mounts of s, in order.
func sessionMounts(s *specs.Spec) []specs.Mount {
	var own []specs.Mount
	for _, m := range s.Mounts {
		if sessionMount(m.Destination) {
			own = append(own, m)
		}
	}
	return own
}

// StartWarm starts spec's session in a sandbox Prepare made: the sandbox's container
// becomes the session's (its libcontainer state and cgroup go by the session's id), the
// session's mounts go into its mount namespace, its limits onto its cgroup, and
// roost-init gets the session's command. The caller has renamed sb.Records to
// spec.RecordsDir, moved the network namespace to spec.NetNS and given the session sb.IDs.
// On an error the sandbox is gone, as Release(spec.SessionID) leaves it.
func (r *Runtime) StartWarm(ctx context.Context, sb *Sandbox, spec containment.Spec) (_ containment.Process, retErr error) {
	defer sb.io.Close()
	if spec.Policy == nil {
		return nil, errors.New("sealed start without a policy")
	}
	id := spec.SessionID
	if spec.IDs != sb.IDs {
		_ = r.Discard(sb)
		return nil, fmt.Errorf("session %s has ids %v, its sandbox %v", id, spec.IDs, sb.IDs)
	}
	layout, err := r.sessionLayout(spec)
	if err != nil {
		_ = r.Discard(sb)
		return nil, err
	}
	full, err := r.sessionSpec(spec, layout)
	if err != nil {
		_ = r.Discard(sb)
		return nil, err
	}
	// The sandbox and the session differ in nothing but their mounts, limits and ids when
	// the policy fits (the rest of a sealed spec is the runtime's own).
	if err := r.Fits(sb.Shape, spec.Policy, spec.Runner != ""); err != nil {
		_ = r.Discard(sb)
		return nil, err
	}
	own := sessionMounts(full)
	config, err := r.config(id, full)
	if err != nil {
		_ = r.Discard(sb)
		return nil, err
	}

	// From here the container is the session's: whatever fails, Release of the session
	// finds and ends it.
	cg := r.Cgroups()
	if err := cg.Move(sb.ID, id); err != nil {
		_ = r.Discard(sb)
		return nil, err
	}
	if err := os.Rename(filepath.Join(r.containers, sb.ID), filepath.Join(r.containers, id)); err != nil {
		_ = cg.Move(id, sb.ID)
		_ = r.Discard(sb)
		return nil, fmt.Errorf("claiming sandbox %s: %w", sb.ID, err)
	}
	defer func() {
		if retErr != nil {
			if sb.proc != nil {
				sb.container.signal(syscall.SIGKILL)
				_, _ = sb.proc.Wait()
			}
			_ = r.Release(id)
		}
	}()
	// A root composed for the sandbox (host_read) is the session's now, to go with it.
	if err := os.Rename(filepath.Join(r.roots, sb.ID), filepath.Join(r.roots, id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("claiming sandbox %s's root: %w", sb.ID, err)
	}
	container := &lazyContainer{containers: r.containers, id: id, initPID: sb.initPID, initStart: sb.initStart}
	// A session with its sandbox's limits (a default capsule's in a default sandbox) has
	// them already: Set would write every cgroup file again to the same values, and the
	// container's state need not be read.
	if !reflect.DeepEqual(sb.config.Cgroups.Resources, config.Cgroups.Resources) {
		c, err := container.get()
		if err != nil {
			return nil, fmt.Errorf("the claimed sandbox: %w", err)
		}
		set := c.Config()
		res := *config.Cgroups.Resources
		cgc := *set.Cgroups
		cgc.Resources = &res
		set.Cgroups = &cgc
		if err := c.Set(set); err != nil {
			return nil, fmt.Errorf("setting the session's cgroup limits: %w", err)
		}
	}
	var tmp specs.Mount
	for _, m := range full.Mounts {
		if m.Destination == "/tmp" {
			tmp = m
		}
	}
	if err := r.attachMounts(sb, own, tmp); err != nil {
		return nil, fmt.Errorf("mounting the session's trees into its sandbox: %w", err)
	}
	if err := sb.io.HandSpec(containment.InitSpec(spec, sealedExecSpec(spec))); err != nil {
		return nil, fmt.Errorf("handing the spec to roost-init: %w", err)
	}
	rep, err := sb.io.ReadReport(ctx)
	if err != nil {
		return nil, err
	}
	if rep.Error != "" || rep.Ref == nil {
		if rep.Error == "" {
			rep.Error = "roost-init ended without starting the program"
		}
		if sb.proc != nil {
			_, _ = sb.proc.Wait()
		}
		return nil, &containment.StartError{Msg: rep.Error}
	}
	return r.started(container, sb.proc, spec.RecordsDir, rep.Ref)
}

// mountAttrs are the mount_setattr flags of an OCI bind mount's options.
func mountAttrs(opts []string) (attrs uint64, recursive bool) {
	for _, o := range opts {
		switch o {
		case "rbind":
			recursive = true
		case "ro":
			attrs |= unix.MOUNT_ATTR_RDONLY
		case "nosuid":
			attrs |= unix.MOUNT_ATTR_NOSUID
		case "nodev":
			attrs |= unix.MOUNT_ATTR_NODEV
		case "noexec":
			attrs |= unix.MOUNT_ATTR_NOEXEC
		}
	}
	return attrs, recursive
}

// attachMounts mounts the session's trees into its sandbox, in the spec's order, as
// libcontainer would have mounted them: each a detached copy of its source (taken here, on
// the host) moved onto its place in the sandbox's mount namespace. Nothing in the sandbox
// runs but roost-init, blocked on its spec, so no process inside can race the paths.
func (r *Runtime) attachMounts(sb *Sandbox, mounts []specs.Mount, tmp specs.Mount) error {
	trees := make([]*os.File, 0, len(mounts))
	defer func() {
		for _, t := range trees {
			t.Close()
		}
	}()
	for _, m := range mounts {
		if m.Type != "bind" {
			return fmt.Errorf("%s: a %s mount cannot be attached", m.Destination, m.Type)
		}
		attrs, recursive := mountAttrs(m.Options)
		flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_SYMLINK_NOFOLLOW)
		if recursive {
			flags |= unix.AT_RECURSIVE
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, m.Source, flags)
		if err != nil {
			return fmt.Errorf("%s: open_tree %s: %w", m.Destination, m.Source, err)
		}
		tree := os.NewFile(uintptr(fd), m.Source)
		trees = append(trees, tree)
		// Only the top mount gets the flags, as a bind of libcontainer's.
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attrs}); err != nil {
			return fmt.Errorf("%s: mount_setattr: %w", m.Destination, err)
		}
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", sb.initPID))
	if err != nil {
		return err
	}
	defer ns.Close()
	// The namespace opened is the sandbox's only if its init is still the one started.
	if st, err := containment.StartTime(sb.initPID); err != nil || st != sb.initStart {
		return errors.New("the sandbox's init has ended")
	}
	done := make(chan error, 1)
	go func() {
		// The thread enters the sandbox's mount namespace and is never used again: the
		// goroutine ends locked, and the runtime ends the thread with it.
		runtime.LockOSThread()
		done <- moveInto(ns, sb.IDs, mounts, trees, tmp)
	}()
	return <-done
}

// moveInto runs on a thread of its own: it joins the mount namespace ns, gives /tmp the
// session's size (tmp, its mount as the session's spec states it) and moves each tree onto
// its mount's destination.
func moveInto(ns *os.File, ids containment.IDs, mounts []specs.Mount, trees []*os.File, tmp specs.Mount) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare CLONE_FS: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("entering the sandbox's mount namespace: %w", err)
	}
	if tmp.Destination != "" {
		flags, data := uintptr(unix.MS_REMOUNT), []string{}
		for _, o := range tmp.Options {
			switch o {
			case "nosuid":
				flags |= unix.MS_NOSUID
			case "nodev":
				flags |= unix.MS_NODEV
			case "noexec":
				flags |= unix.MS_NOEXEC
			case "exec":
			default:
				data = append(data, o)
			}
		}
		if err := unix.Mount("", tmp.Destination, "", flags, strings.Join(data, ",")); err != nil {
			return fmt.Errorf("%s: remounting with the session's size: %w", tmp.Destination, err)
		}
	}
	for i, m := range mounts {
		if m.Destination == TaskPath {
			if err := makeFileMountPoint(m.Destination, ids); err != nil {
				return fmt.Errorf("%s: %w", m.Destination, err)
			}
		}
		dest, err := unix.Openat2(unix.AT_FDCWD, m.Destination, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			return fmt.Errorf("%s: %w", m.Destination, err)
		}
		err = unix.MoveMount(int(trees[i].Fd()), "", dest, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(dest)
		if err != nil {
			return fmt.Errorf("%s: move_mount: %w", m.Destination, err)
		}
	}
	return nil
}

// makeFileMountPoint makes an empty file (and its directories) to mount a file on, in a
// tmpfs of the sandbox's: as the sandbox's root, the only owner its user namespace maps.
func makeFileMountPoint(p string, ids containment.IDs) error {
	if err := unix.Setfsgid(int(ids.First)); err != nil {
		return err
	}
	if err := unix.Setfsuid(int(ids.First)); err != nil {
		return err
	}
	defer func() {
		_ = unix.Setfsuid(0)
		_ = unix.Setfsgid(0)
	}()
	if err := os.MkdirAll(path.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// config converts a sealed session's OCI spec to libcontainer's configuration.
func (r *Runtime) config(id string, s *specs.Spec) (*configs.Config, error) {
	config, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:       id,
		UseSystemdCgroup: r.Cgroups().Driver() == cgroups.DriverSystemd,
		NoNewKeyring:     true,
		Spec:             s,
	})
	if err != nil {
		return nil, fmt.Errorf("converting the OCI spec: %w", err)
	}
	return config, nil
}
