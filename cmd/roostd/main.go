// roostd is roost's daemon: it keeps the session registry, supervises sessions and serves
// the control API on a unix socket and metrics over HTTP.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"roost.dev/roost/pkg/session/delegate"
	"roost.dev/roost/pkg/session/ranges"
	"roost.dev/roost/pkg/session/retention"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/session/warmpool"
	"roost.dev/roost/pkg/wasmcache"

	"github.com/spf13/pflag"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/sealer"
	"roost.dev/roost/pkg/gateway"
	"roost.dev/roost/pkg/hooks"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/metrics"
	"roost.dev/roost/pkg/server"
	"roost.dev/roost/pkg/session"
	"roost.dev/roost/pkg/version"
)

func main() {
	// The same binary is each session's roost-init and roost-exec; those roles never reach
	// the daemon's flag parsing.
	if containment.RunHelper(os.Args) {
		return
	}
	os.Exit(run(os.Args[1:]))
}

type options struct {
	stateDir      string
	socket        string
	socketGroup   string
	metricsAddr   string
	configFile    string
	maxDepth      int
	maxConcurrent int
	machineTokens int64
	// machineTokensArg: the flag as typed (units allowed), parsed into machineTokens.
	machineTokensArg string
	// machineTokensSet: the flag was given, so it replaces the ceiling the ledger keeps
	// (roostctl spend set-limit changes it at run time; a restart without the flag keeps that).
	machineTokensSet bool
	reservationTTL   time.Duration
	containment      string
	showVersion      bool
	// warmPool, warmCapsules and warmPoolCPU are --warm-pool, --warm-pool-capsule and
	// --warm-pool-cpu.
	warmPool     int
	warmCapsules []session.WarmCapsule
	warmPoolCPU  float64
	// retainEnded and retainFor bound the ended sessions kept (0: no bound).
	retainEnded int
	retainFor   time.Duration
	// cgroupParent and cgroupDriver are --cgroup-parent and --cgroup-driver.
	cgroupParent, cgroupDriver string
	// listenTCP, tlsCert, tlsKey and clientCA are the remote listener's flags, each
	// overriding its key of the config's remote section.
	listenTCP, tlsCert, tlsKey, clientCA string
	// fleetEtcd, nodeName and the etcd TLS files make roostd a fleet node, each overriding
	// its key of the config's fleet section.
	fleetEtcd, nodeName, fleetEtcdCA, fleetEtcdCert, fleetEtcdKey string
	// fleetNodeCert, fleetNodeKey and fleetPeerCA are the node's side of the node-to-node
	// mTLS calls are routed over, each overriding its key of fleet.node_tls.
	fleetNodeCert, fleetNodeKey, fleetPeerCA string
	// logLevel and logFormat are --log-level and --log-format.
	logLevel  slog.Level
	logFormat string
}

// The metrics hear session starts, recoveries, spawn decisions and the ledger's charges.
var (
	_ session.Observer            = (*metrics.Metrics)(nil)
	_ delegate.SpawnObserver      = (*metrics.Metrics)(nil)
	_ session.LimitObserver       = (*metrics.Metrics)(nil)
	_ session.ExecRefusalObserver = (*metrics.Metrics)(nil)
	_ session.EndObserver         = (*metrics.Metrics)(nil)
	_ ranges.Observer             = (*metrics.Metrics)(nil)
	_ retention.Observer          = (*metrics.Metrics)(nil)
	_ ledger.Observer             = (*metrics.Metrics)(nil)
)

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs, warmCapsules, logLevel := flagSet(o)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (roostd takes only flags)", fs.Arg(0))
	}
	o.machineTokensSet = fs.Changed("machine-tokens-per-day")
	var err error
	if o.machineTokensSet {
		if o.machineTokens, err = manifest.ParseTokens(o.machineTokensArg); err != nil {
			return nil, fmt.Errorf("--machine-tokens-per-day %q: %w", o.machineTokensArg, err)
		}
	}
	for _, arg := range *warmCapsules {
		c, err := parseWarmCapsule(arg)
		if err != nil {
			return nil, err
		}
		o.warmCapsules = append(o.warmCapsules, c)
	}
	if o.logLevel, err = parseLogLevel(*logLevel); err != nil {
		return nil, err
	}
	if err := checkLogFormat(o.logFormat); err != nil {
		return nil, err
	}
	switch {
	case o.maxDepth < 0:
		return nil, fmt.Errorf("--max-depth %d: must be 0 or more", o.maxDepth)
	case o.maxConcurrent < 0:
		return nil, fmt.Errorf("--max-concurrent %d: must be 0 or more", o.maxConcurrent)
	case o.reservationTTL < time.Second:
		return nil, fmt.Errorf("--reservation-ttl %s: must be at least 1s", o.reservationTTL)
	case o.warmPool < 0:
		return nil, fmt.Errorf("--warm-pool %d: must be 0 or more", o.warmPool)
	case o.warmPoolCPU <= 0 || o.warmPoolCPU > 1:
		return nil, fmt.Errorf("--warm-pool-cpu %g: must be more than 0 and at most 1", o.warmPoolCPU)
	case o.retainEnded < 0:
		return nil, fmt.Errorf("--retain-ended %d: must be 0 or more", o.retainEnded)
	case o.retainFor < 0:
		return nil, fmt.Errorf("--retain-for %s: must be 0 or more", o.retainFor)
	}
	return o, nil
}

// flagSet defines roostd's flags (man/roostd.8 describes each) on a new set, filling o; the
// two read after parsing come back as they were given.
func flagSet(o *options) (fs *pflag.FlagSet, warmCapsules *[]string, logLevel *string) {
	fs = pflag.NewFlagSet("roostd", pflag.ContinueOnError)
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/roost", "directory for the registry, session records and workdirs")
	fs.StringVar(&o.socket, "socket", "/run/roost/roostd.sock", "unix socket the control API listens on (mode 0660)")
	fs.StringVar(&o.socketGroup, "socket-group", "", "group (NAME or GID) whose members may use the control socket besides root; default none")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:9464", `HOST:PORT serving /metrics; "" disables`)
	fs.StringVar(&o.listenTCP, "listen-tcp", "", "also serve the control API on `HOST:PORT` over TLS 1.3 with client certificates (remote.listen); default off")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "the remote listener's certificate, PEM (remote.tls_cert)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "the remote listener's private key, PEM, mode 0600 (remote.tls_key)")
	fs.StringVar(&o.clientCA, "client-ca", "", "the CA remote clients' certificates must chain to, PEM (remote.client_ca)")
	fs.StringVar(&o.fleetEtcd, "fleet-etcd", "", "make roostd a node of a fleet ledger kept in the etcd cluster at `URL[,URL...]` (fleet.etcd); default off: a single host")
	fs.StringVar(&o.nodeName, "node-name", "", "this roostd's `NAME` in the fleet, unique and the same across restarts (fleet.node_name)")
	fs.StringVar(&o.fleetEtcdCA, "fleet-etcd-ca", "", "the CA the etcd members' certificates chain to, PEM (fleet.etcd_ca)")
	fs.StringVar(&o.fleetEtcdCert, "fleet-etcd-cert", "", "this node's client certificate for etcd, PEM (fleet.etcd_cert)")
	fs.StringVar(&o.fleetEtcdKey, "fleet-etcd-key", "", "its private key, PEM (fleet.etcd_key)")
	fs.StringVar(&o.fleetNodeCert, "fleet-node-cert", "", "this node's client certificate for the other nodes' listeners, PEM, its Common Name the --node-name; calls about their sessions are forwarded to them (fleet.node_tls.cert)")
	fs.StringVar(&o.fleetNodeKey, "fleet-node-key", "", "its private key, PEM, mode 0600 (fleet.node_tls.key)")
	fs.StringVar(&o.fleetPeerCA, "fleet-peer-ca", "", "the CA the other nodes' listeners' certificates chain to, PEM; default the remote listener's --client-ca (fleet.node_tls.ca)")
	fs.StringVar(&o.configFile, "config", "", "YAML file with inference upstreams and other long settings")
	fs.IntVar(&o.maxDepth, "max-depth", 3, "delegation depth allowed below a top-level session")
	fs.IntVar(&o.maxConcurrent, "max-concurrent", 4, "live children per parent session")
	fs.StringVar(&o.machineTokensArg, "machine-tokens-per-day", "0", "machine-wide ceiling of `TOKENS` per UTC day: a whole number, or with k, M or G (powers of 1000: 500k, 10M); 0 = none (when absent, the last one set is kept)")
	fs.DurationVar(&o.reservationTTL, "reservation-ttl", ledger.DefaultTTL, "how long a token reservation stays open before it is charged in full")
	fs.StringVar(&o.containment, "containment", "", "host-wide containment floor: unconfined, advisory, scoped or sealed")
	fs.StringVar(&o.cgroupParent, "cgroup-parent", "", "where sessions' cgroups go: a cgroup path (cgroupfs) or a slice (systemd); default: beneath roostd's own cgroup when systemd delegates it in a leaf (DelegateSubgroup=supervisor), else /roost")
	fs.StringVar(&o.cgroupDriver, "cgroup-driver", cgroups.DriverCgroupfs, "how sessions' cgroups are made: cgroupfs, or systemd (transient roost-<session>.scope units; needs systemd as PID 1)")
	fs.IntVar(&o.warmPool, "warm-pool", 0, "sealed sandboxes to keep made ahead of their sessions, each used by one session and then ended; 0 = none")
	warmCapsules = fs.StringArray("warm-pool-capsule", nil, "DIR=N: also keep N sealed sandboxes made for the capsule in DIR, for capsules whose seccomp variant, host_read, workdir_exec or rlimits a default one's sandbox lacks (repeatable)")
	fs.Float64Var(&o.warmPoolCPU, "warm-pool-cpu", warmpool.DefaultCPU, "share of the wall clock (0-1] the warm pool's refill may spend making sandboxes")
	fs.IntVar(&o.retainEnded, "retain-ended", 0, "keep at most this many ended sessions, removing those that ended first (as roostctl rm does) and their events; 0 = no bound")
	fs.DurationVar(&o.retainFor, "retain-for", 0, "remove ended sessions that ended longer ago than this (e.g. 720h), and their events; 0 = no bound")
	logLevel = fs.String("log-level", "info", "least severe log lines written: debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "log line format on stderr: text (key=value) or json (one object per line)")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: roostd [flags]\n\nroostd keeps roost's session registry and supervises sessions.\n\nFlags:\n%s", fs.FlagUsages())
	}
	return fs, warmCapsules, logLevel
}

// parseWarmCapsule reads one --warm-pool-capsule: DIR=N.
func parseWarmCapsule(arg string) (session.WarmCapsule, error) {
	i := strings.LastIndexByte(arg, '=')
	if i <= 0 {
		return session.WarmCapsule{}, fmt.Errorf("--warm-pool-capsule %q: want DIR=N, the capsule's directory and how many sandboxes of its shape to keep (e.g. ./capsules/agent=2)", arg)
	}
	n, err := strconv.Atoi(arg[i+1:])
	if err != nil || n < 1 {
		return session.WarmCapsule{}, fmt.Errorf("--warm-pool-capsule %q: %q is not a number of sandboxes: want 1 or more", arg, arg[i+1:])
	}
	dir, err := filepath.Abs(arg[:i])
	if err != nil {
		return session.WarmCapsule{}, fmt.Errorf("--warm-pool-capsule %q: %w", arg, err)
	}
	return session.WarmCapsule{Dir: dir, Size: n}, nil
}

func run(args []string) int {
	o, err := parseFlags(args)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		// Before any logger: a usage error, said once, as roostctl says its own.
		fmt.Fprintln(os.Stderr, "roostd:", err)
		return 2
	}
	if o.showVersion {
		fmt.Println("roostd", version.Version, version.Commit)
		return 0
	}
	log := newLogger(os.Stderr, o.logLevel, o.logFormat)
	// First: nothing roostd starts may inherit the service manager's variables.
	sm := newServiceManager(log)
	defer sm.close()
	sm.startWatchdog()
	started := time.Now()
	raiseOpenFiles(log)
	// stopping is when the shutdown began (a signal, or the API failing); zero when serve
	// never got to serve.
	var stopping time.Time
	err = serve(o, log, sm, &stopping)
	attrs := []any{"uptime", time.Since(started).Round(time.Millisecond).String()}
	if !stopping.IsZero() {
		attrs = append(attrs, "shutdown", time.Since(stopping).Round(time.Millisecond).String())
	}
	if err != nil {
		sm.status("failed: " + err.Error())
		// The one place a fatal error is said, and roostd's last line.
		log.Error("roostd stopped", append([]any{"err", err, "exit_code", 1}, attrs...)...)
		return 1
	}
	log.Info("roostd stopped", append([]any{"exit_code", 0}, attrs...)...)
	return 0
}

// liveInRegistry counts the sessions the registry lists as live: those recovery will
// reconcile. It opens the registry and closes it again before session.Open takes it.
func liveInRegistry(stateDir string) (int, error) {
	reg, err := store.OpenRegistry(filepath.Join(stateDir, store.DBFile))
	if err != nil {
		return 0, err
	}
	defer reg.Close()
	var n int
	err = reg.View(func(tx *store.Tx) error {
		live, err := tx.List(store.State.Live)
		n = len(live)
		return err
	})
	return n, err
}

// raiseOpenFiles lifts roostd's soft open-file limit to its hard one, and logs both. (Go's
// runtime lifts it to one below at start; past this, the processes roostd starts inherit
// the raised limit too: each session's program gets its own resources.max_open_files.)
func raiseOpenFiles(log *slog.Logger) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("reading the open-file limit", "err", err)
		return
	}
	if lim.Cur < lim.Max {
		raised := syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			log.Warn("raising the open-file limit", "soft", lim.Cur, "hard", lim.Max, "err", err)
			return
		}
		lim = raised
	}
	log.Info("open-file limit", "soft", lim.Cur, "hard", lim.Max)
}

// rehearse runs a class's rehearsal, and again when it fails: the class it decides is
// offered, or not, for the daemon's whole life, so one unlucky moment must not decide it.
func rehearse(ctx context.Context, run func(context.Context) error) error {
	var err error
	for range 3 {
		if err = run(ctx); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// initBinary finds roost-init next to roostd. Without it, sessions start under roostd's
// own binary playing roost-init, which works but costs several milliseconds per launch.
func initBinary(log *slog.Logger) string {
	if path, ok := besideRoostd("roost-init", log); ok {
		return path
	}
	log.Warn("roost-init not found next to roostd; sessions start under roostd's own binary (slower launches)")
	return containment.SelfInit
}

// sealerClient starts roost-sealer from next to roostd, to start sealed sessions'
// containers. Without it (nil) roostd starts them itself, which works but costs every
// sealed start the re-execution of roostd's own binary as the container's init.
func sealerClient(log *slog.Logger) *sealer.Client {
	path, ok := besideRoostd(sealer.Name, log)
	if !ok {
		log.Warn("roost-sealer not found next to roostd; roostd starts sealed containers itself (slower sealed starts)")
		return nil
	}
	c, err := sealer.NewClient(path)
	if err != nil {
		log.Warn("roost-sealer did not start; roostd starts sealed containers itself (slower sealed starts)", "err", err)
		return nil
	}
	log.Info("sealed containers start through roost-sealer", "path", path)
	return c
}

// besideRoostd finds an executable helper named name in roostd's own directory.
func besideRoostd(name string, log *slog.Logger) (string, bool) {
	exe, err := os.Executable()
	if err != nil {
		return "", false
	}
	path := filepath.Join(filepath.Dir(exe), name)
	info, err := os.Stat(path)
	switch {
	case err != nil:
	case info.Mode().Perm()&0o022 != 0:
		// roostd runs it as root: a binary others can rewrite would be theirs to run.
		log.Warn("ignoring "+name+": it is writable by group or others", "path", path, "mode", info.Mode().String())
	case info.Mode().IsRegular() && info.Mode().Perm()&0o100 != 0:
		return path, true
	}
	return "", false
}

// operatorHooks readies roostd's configured hooks: each module compiled once now, every run
// as the uid of roostd's own id range (slot 0: never a session's), with no files and no
// environment. Nil when there are none.
func operatorHooks(list []config.Hook, wasm *wasmcache.Cache, ids containment.IDs, mtr *metrics.Metrics, sink hooks.EventSink, log *slog.Logger) (*hooks.Hooks, error) {
	if len(list) == 0 {
		return nil, nil
	}
	if wasm == nil {
		return nil, errors.New("--config declares hooks, but roost-wasm, which runs them, is not next to roostd (make build puts it in ./bin)")
	}
	// Compiled in the background: roostd serves at once, and a hook run before its module
	// is compiled compiles it in its runner instead.
	go func() {
		for _, h := range list {
			if _, _, err := wasm.Compiled(h.Module); err != nil {
				log.Error("a hook's module does not compile: its runs will fail, and a stage hook refuses every session", "hook", h.Name, "module", h.Module, "err", err)
				continue
			}
			log.Info("hook ready", "hook", h.Name, "on", h.On, "module", h.Module)
		}
	}()
	runner := hooks.NewExecRunner(hooks.Config{
		Runner:     wasm.Runner(),
		Credential: &syscall.Credential{Uid: ids.First, Gid: ids.First, Groups: []uint32{}},
		Compiled:   wasm.Cached,
	})
	return hooks.New(list, runner, mtr, sink, log), nil
}

// hookSink hands hook runs to the session manager, which exists only after the hooks do.
type hookSink struct {
	mu sync.Mutex
	m  *session.Manager
}

func (s *hookSink) set(m *session.Manager) { s.mu.Lock(); s.m = m; s.mu.Unlock() }

func (s *hookSink) manager() *session.Manager {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m
}

// HookEvent records a run as an event once the manager is there.
func (s *hookSink) HookEvent(hook string, r hooks.Result, subject string) {
	s.mu.Lock()
	m := s.m
	s.mu.Unlock()
	if m != nil {
		m.HookEvent(hook, r, subject)
	}
}

// loggedLedger is the ledger as the inference gateway uses it: a refused admission is
// logged with the session's capsule and class, as the session manager logs those its
// endpoint's own admissions meet. A call that waits for budget (on_exhausted: wait) is
// refused again at every change of the ledger: a session's refusals are logged at most
// once per refusalLogEvery, with how many went unlogged.
type loggedLedger struct {
	*ledger.Ledger
	sessions *hookSink
	log      *slog.Logger

	mu     sync.Mutex
	logged map[string]refusalLog
}

type refusalLog struct {
	at         time.Time
	suppressed int
}

const refusalLogEvery = 10 * time.Second

var _ gateway.Ledger = (*loggedLedger)(nil)

func (l *loggedLedger) Admit(a ledger.Admission) (ledger.Reservation, error) {
	res, err := l.Ledger.Admit(a)
	var refusal *ledger.Refusal
	if errors.As(err, &refusal) {
		now := time.Now()
		l.mu.Lock()
		if l.logged == nil {
			l.logged = map[string]refusalLog{}
		}
		last, seen := l.logged[a.SessionID]
		if seen && now.Sub(last.at) < refusalLogEvery {
			last.suppressed++
			l.logged[a.SessionID] = last
			l.mu.Unlock()
			return res, err
		}
		if len(l.logged) > 1024 {
			for id, r := range l.logged {
				if now.Sub(r.at) >= refusalLogEvery {
					delete(l.logged, id)
				}
			}
		}
		l.logged[a.SessionID] = refusalLog{at: now}
		l.mu.Unlock()
		attrs := []any{"session", a.SessionID}
		if m := l.sessions.manager(); m != nil {
			if rec, err := m.Get(a.SessionID); err == nil {
				attrs = append(attrs, "capsule", rec.Capsule.Name+"@"+rec.Capsule.Version, "class", rec.Achieved)
			}
		}
		l.log.Info("spend refused", append(attrs, "limit", refusal.Kind(), "ceiling", refusal.Ceiling, "used", refusal.Used,
			"requested", refusal.Requested, "model", a.Model, "reason", refusal.Error(), "unlogged_since_last", last.suppressed)...)
	}
	return res, err
}

// wasmRunner finds roost-wasm next to roostd; "" when it is not there (WASM capsules are
// then refused at stage). roostd runs it as root to compile modules, so one others can
// rewrite is ignored.
func wasmRunner(log *slog.Logger) string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	path := filepath.Join(filepath.Dir(exe), "roost-wasm")
	info, err := os.Stat(path)
	switch {
	case err != nil:
		log.Info("no WASM runner next to roostd: run.wasm capsules are refused", "path", path)
	case info.Mode().Perm()&0o022 != 0:
		log.Warn("ignoring roost-wasm: it is writable by group or others", "path", path, "mode", info.Mode().String())
	case info.Mode().IsRegular() && info.Mode().Perm()&0o111 == 0o111:
		return path
	default:
		log.Warn("ignoring roost-wasm: sessions' uids must be able to run it (mode 0755)", "path", path, "mode", info.Mode().String())
	}
	return ""
}

// lookupSocketGroup resolves --socket-group; nil when it is not given.
func lookupSocketGroup(name string) (*server.SocketGroup, error) {
	if name == "" {
		return nil, nil
	}
	if gid, err := strconv.ParseUint(name, 10, 32); err == nil {
		g := &server.SocketGroup{Name: name, GID: uint32(gid)}
		// A gid needs no entry in the group database; its name only reads better.
		if grp, err := user.LookupGroupId(name); err == nil {
			g.Name = grp.Name
		}
		return g, nil
	}
	grp, err := user.LookupGroup(name)
	if err != nil {
		return nil, fmt.Errorf("--socket-group %s: %w", name, err)
	}
	gid, err := strconv.ParseUint(grp.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("--socket-group %s: gid %q: %w", name, grp.Gid, err)
	}
	return &server.SocketGroup{Name: grp.Name, GID: uint32(gid)}, nil
}

// served says whether a live daemon answers on the socket at path.
func served(path string) bool {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// listen opens the control socket with mode 0660, owned by root and group (when given). A
// socket file left by a daemon that died is replaced; one a live daemon answers on is not.
func listen(path string, group *server.SocketGroup) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	if _, err := os.Stat(path); err == nil {
		if served(path) {
			return nil, fmt.Errorf("--socket %s: another roostd is serving on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--socket %s: removing the stale socket: %w", path, err)
		}
	}
	// Create it with no access at all, then open it to the group: nobody can connect in
	// between with wider rights.
	old := syscall.Umask(0o777)
	lis, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("--socket %s: %w", path, err)
	}
	if group != nil {
		if err := os.Chown(path, 0, int(group.GID)); err != nil {
			lis.Close()
			return nil, fmt.Errorf("--socket-group %s: %w", group.Name, err)
		}
	}
	if err := os.Chmod(path, 0o660); err != nil {
		lis.Close()
		return nil, fmt.Errorf("--socket %s: %w", path, err)
	}
	return lis, nil
}
