package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"roost.dev/roost/pkg/artifact"
	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/idsweep"
	scopedrt "roost.dev/roost/pkg/containment/scoped"
	sealedrt "roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/endpoint"
	"roost.dev/roost/pkg/fdbudget"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/fleet/placement"
	"roost.dev/roost/pkg/fleet/route"
	"roost.dev/roost/pkg/gateway"
	"roost.dev/roost/pkg/hostaddr"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/metrics"
	"roost.dev/roost/pkg/server"
	"roost.dev/roost/pkg/session"
	"roost.dev/roost/pkg/session/dirs"
	"roost.dev/roost/pkg/session/retention"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/spawn"
	"roost.dev/roost/pkg/wasmcache"
)

// daemon is what roostd is made of before it serves: built by assemble, served by serve,
// released by close.
type daemon struct {
	stateDir string
	// trees are the session trees Seal made nosuid,nodev, which doctor checks stay so.
	trees     []string
	group     *server.SocketGroup
	pool      store.IDPool
	init      string
	cgs       *cgroups.Sessions
	assess    func(context.Context) (containment.Host, containment.Catalog)
	catalog   containment.Catalog
	mtr       *metrics.Metrics
	artifacts *artifact.Store
	spend     *ledger.Ledger
	// fleet is what the fleet RPCs need; nil for a single host.
	fleet *server.Fleet
	// staged lists the reservations of sessions placed here, for the node directory's
	// writes to settle; nil for a single host.
	staged *placement.Staged
	// placing places sessions staged here over the fleet; nil without a router.
	placing *placement.Stager
	// route carries calls about other nodes' sessions to them; nil when calls are not
	// routed (a single host, or a node without --fleet-node-cert).
	route    *route.Router
	sessions *session.Manager
	// control bounds the control API (the config's control section).
	control config.Control
	// remote is the config's remote section, which the remote flags override.
	remote config.Remote
	// fds is the descriptor budget every holder of a descriptor for a session takes from.
	fds *fdbudget.Budget
	// release undoes each part in the order the parts were made; close runs it backwards,
	// as the defers of one function would.
	release []func()
}

// assemble makes roostd's parts from its options, each after those it needs: the state
// directory, session cgroups, runtimes and the catalog of classes they pass, metrics, the
// artifact store, the spend ledger, session endpoints, hooks, and the session manager
// with every session recovered. When one fails, those made before it are released.
func assemble(o *options, log *slog.Logger, sm *serviceManager) (*daemon, error) {
	d := &daemon{}
	// What was made is released on a panic too, not only on an error: a roostd that
	// panics still closes its registry and ledger cleanly on the way down.
	assembled := false
	defer func() {
		if !assembled {
			d.close()
		}
	}()
	var floor manifest.Class
	if o.containment != "" {
		c, err := manifest.ParseClass(o.containment)
		if err != nil {
			return nil, fmt.Errorf("--containment: %w", err)
		}
		floor = c
	}
	group, err := lookupSocketGroup(o.socketGroup)
	if err != nil {
		return nil, err
	}
	cfg := config.Defaults()
	if o.configFile != "" {
		var err error
		if cfg, err = config.Load(o.configFile); err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
	}
	if err := cfg.CheckSecrets(); err != nil {
		return nil, fmt.Errorf("--config %s: %w", o.configFile, err)
	}
	fleetCfg, err := fleetFromOptions(o, cfg.Fleet)
	if err != nil {
		return nil, err
	}
	stateDir, err := filepath.Abs(o.stateDir)
	if err != nil {
		return nil, err
	}

	// Before any runtime makes its part of it: the sessions' uids must pass through.
	if err := dirs.Prepare(stateDir); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	// Before any session can write there: what sessions leave on the host must not run
	// setuid, or open a device, for whoever on the host comes across it.
	trees := append(dirs.Trees(stateDir), scopedrt.TmpRoot(stateDir))
	if err := dirs.Seal(trees...); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	if err := store.CheckFree(filepath.Join(stateDir, store.DBFile)); err != nil {
		return nil, err
	}
	pool := store.IDPool{First: cfg.Sessions.IDs.First, Slots: cfg.Sessions.IDs.Slots}
	// Freed ranges are swept by killing what runs on them: the block must be this
	// daemon's alone on the host.
	claim, err := idsweep.Claim(idsweep.DefaultClaims, uint64(pool.First), uint64(pool.First)+uint64(pool.Slots)*config.IDsPerSession)
	if err != nil {
		return nil, fmt.Errorf("sessions.ids: %w", err)
	}
	d.release = append(d.release, claim.Release)
	// Before any runtime or child process: on cgroup v2 roostd may move itself into a leaf.
	cgs, err := cgroups.New(cgroups.Config{Parent: o.cgroupParent, Driver: o.cgroupDriver, StateDir: stateDir})
	if err != nil {
		return nil, err
	}
	log.Info("session cgroups", "driver", cgs.Driver(), "parent", cgs.Parent(), "why", cgs.Why())
	init := initBinary(log)
	plain := containment.NewProcessRuntime(init, containment.WithCgroups(cgs))
	runtimes := map[manifest.Class]session.Runtime{manifest.Unconfined: plain, manifest.Advisory: plain}
	var sealed *sealedrt.Runtime
	var scoped *scopedrt.Runtime
	if init != containment.SelfInit {
		// A sealed root mounts roost-init itself: it must be the small static binary.
		seal := sealerClient(log)
		if seal != nil {
			d.release = append(d.release, func() { seal.Close() })
		}
		if sealed, err = sealedrt.NewRuntime(stateDir, init, containment.IDs(pool.RehearsalIDs()), containment.WithCgroups(cgs), containment.WithSealer(seal)); err != nil {
			return nil, fmt.Errorf("sealed runtime: %w", err)
		}
		if scoped, err = scopedrt.NewRuntime(stateDir, init, containment.IDs(pool.RehearsalIDs()), containment.WithCgroups(cgs)); err != nil {
			return nil, fmt.Errorf("scoped runtime: %w", err)
		}
		// Even when a rehearsal fails, sessions a previous daemon started are re-attached
		// and cleaned up through these; staging new ones follows the catalog.
		runtimes[manifest.Sealed] = sealed
		runtimes[manifest.Scoped] = scoped
	}
	noInit := errors.New("roost-init was not found next to roostd; install it there (make build puts it in ./bin)")
	assess := func(ctx context.Context) (containment.Host, containment.Catalog) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		host := containment.Probe()
		cgs.Report(&host)
		if sealed == nil {
			return host, containment.NewCatalog(host, noInit, noInit)
		}
		return host, containment.NewCatalog(host, rehearse(ctx, scoped.Rehearse), rehearse(ctx, sealed.Rehearse))
	}
	sm.status("starting: probing the host and rehearsing containment classes")
	host, catalog := assess(context.Background())
	for _, c := range catalog {
		if !c.Available {
			log.Warn("containment class unavailable", "class", c.Class.String(), "why", c.Detail)
		}
	}
	var mtr *metrics.Metrics
	var sessions *session.Manager
	states := make([]string, len(store.States))
	for i, s := range store.States {
		states[i] = string(s)
	}
	mtr = metrics.New(states, func() map[string]int {
		out := map[string]int{}
		if sessions != nil {
			for s, n := range sessions.Status().ByState {
				out[string(s)] = n
			}
		}
		return out
	})
	artifacts, err := artifact.Open(filepath.Join(stateDir, "artifacts"))
	if err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	d.release = append(d.release, func() { artifacts.Close() })
	ledgerCfg := ledger.Config{Path: filepath.Join(stateDir, ledger.File), TTL: o.reservationTTL, ExpireEvery: time.Second, Observer: mtr, Logger: log}
	if o.machineTokensSet {
		ledgerCfg.MachineCeiling = &o.machineTokens
	}
	ledgerCfg.Fleet = fleetCfg.enabled()
	var fleetStore *etcdstore.Store
	spend, err := ledger.Open(ledgerCfg)
	if err != nil {
		return nil, fmt.Errorf("spend ledger: %w", err)
	}
	d.release = append(d.release, func() { spend.Close() })
	if fleetCfg.enabled() {
		// Released before the ledger closes: the node's shutdown reads what it spent.
		f, store, release, err := openFleet(fleetCfg, stateDir, spend, mtr, log)
		if err != nil {
			return nil, err
		}
		d.release = append(d.release, release)
		d.fleet, fleetStore = f, store
	}
	mtr.WatchBudget(spend)
	keys, err := spawn.LoadKeys(filepath.Join(stateDir, spawn.KeyFile))
	if err != nil {
		return nil, fmt.Errorf("credential key: %w", err)
	}
	// Everything roostd holds for sessions (endpoint connections, egress sockets, model
	// calls, log readers' files) stays below the open-file limit by a reserve, so the
	// control socket, the registry and recovery always find a descriptor.
	var nofile syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile)
	fds := fdbudget.New(nofile.Cur, cfg.Sessions.DescriptorsPerSession)
	st := fds.Stats()
	log.Info("descriptor budget", "open_file_limit", st.Limit, "reserve", st.Reserve, "all_sessions", st.Total, "per_session", st.Share)
	mtr.WatchDescriptors(fds.Stats)
	endpoints, err := endpoint.New(keys, filepath.Join(stateDir, "netns"), log, endpoint.WithBudget(fds))
	if err != nil {
		return nil, fmt.Errorf("session endpoints: %w", err)
	}
	wasm := wasmcache.New(wasmRunner(log), stateDir)
	sink := &hookSink{}
	hooksRun, err := operatorHooks(cfg.Hooks, wasm, containment.IDs(pool.RehearsalIDs()), mtr, sink, log)
	if err != nil {
		return nil, err
	}
	var sessionHooks session.Hooks
	if hooksRun != nil {
		sessionHooks = hooksRun
		d.release = append(d.release, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hooksRun.Close(ctx)
		})
	}
	// The proxy dials from roostd's network namespace: every address its interfaces hold
	// is the host's own, refused to sessions as loopback is.
	hostNS, err := hostaddr.Current()
	if err != nil {
		return nil, fmt.Errorf("host addresses: %w", err)
	}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	hostAddrs, err := hostaddr.Watch(watchCtx, hostNS, log)
	if err != nil {
		stopWatch()
		hostNS.Close()
		return nil, fmt.Errorf("host addresses: %w", err)
	}
	d.release = append(d.release, func() {
		stopWatch()
		<-hostAddrs.Done()
		hostNS.Close()
	})
	log.Info("egress treats the host's interface addresses as the host's own (refused unless egress.permit_cidrs names them), followed as they change", "addresses", fmt.Sprint(hostAddrs.Addrs()))
	if n, err := liveInRegistry(stateDir); err == nil {
		sm.status(fmt.Sprintf("recovering %d session%s", n, plural(n)))
		log.Info("recovering sessions", "live_in_registry", n)
	}
	gw := gateway.New(cfg.Inference.Upstreams, &loggedLedger{Ledger: spend, sessions: sink, log: log}, log,
		gateway.WithLimits(gateway.Limits{BodyBytesInFlight: cfg.Inference.MaxBodyBytesInFlight, CallsPerSession: cfg.Inference.MaxCallsPerSession}),
		gateway.WithDescriptors(fds))
	gl := gw.Limits()
	log.Info("inference gateway", "max_body_bytes_in_flight", gl.BodyBytesInFlight, "max_calls_per_session", gl.CallsPerSession, "max_body_bytes", gl.MaxBody)
	recoveryStarted := time.Now()
	sessions, err = session.Open(session.Config{
		StateDir:        stateDir,
		DaemonFloor:     floor,
		Host:            host,
		Catalog:         catalog,
		Runtimes:        runtimes,
		Artifacts:       artifacts,
		Endpoints:       endpoints,
		MaxDepth:        o.maxDepth,
		MaxConcurrent:   o.maxConcurrent,
		WarmPool:        o.warmPool,
		WarmCapsules:    o.warmCapsules,
		WarmPoolCPU:     o.warmPoolCPU,
		Ledger:          spend,
		Gateway:         gw,
		Descriptors:     fds,
		Observer:        mtr,
		Logger:          log,
		IDs:             pool,
		RangesPerTree:   int(cfg.Sessions.IDs.PerTree),
		RangesForSpawns: int(cfg.Sessions.IDs.Spawns),
		AllowRoot:       cfg.Sessions.AllowRoot,
		HostPaths:       cfg.Sessions.HostPaths,
		EnvPassthrough:  cfg.Env.Passthrough,
		Wasm:            wasm,
		Hooks:           sessionHooks,
		SessionView:     server.SessionProto,
		Egress: &egress.Config{Hosts: cfg.Egress.HostAddrs(), PermitCIDRs: cfg.Egress.Prefixes(),
			MaxConnectionsPerSession: cfg.Egress.MaxConnectionsPerSession, MaxBytesPerSecPerSession: cfg.Egress.MaxBytesPerSecPerSession,
			HostAddrs: hostAddrs, Descriptors: fds},
	})
	if err != nil {
		return nil, err
	}
	sink.set(sessions)
	mtr.WatchIDRanges(func() map[string]int { return sessions.Status().Ranges })
	d.release = append(d.release, func() { sessions.Close() })
	if o.warmPool > 0 || len(o.warmCapsules) > 0 {
		mtr.WatchWarmPool(func() int { return sessions.Status().WarmReady })
		var shaped []string
		for _, c := range o.warmCapsules {
			shaped = append(shaped, fmt.Sprintf("%s=%d", c.Dir, c.Size))
		}
		log.Info("keeping sealed sandboxes made ahead", "warm_pool", o.warmPool, "warm_pool_capsules", strings.Join(shaped, ","), "refill_cpu", o.warmPoolCPU)
	}
	if fleetStore != nil {
		// After the sessions, whose counts it says; stopped before they close.
		rs, err := remoteSettings(o, cfg.Remote)
		if err != nil {
			return nil, err
		}
		d.staged = placement.NewStaged(fleetCfg.node, "")
		stop, publish, err := registerNode(fleetCfg, fleetStore, rs.Listen.Value, catalog, sessions, pool.Slots, d.staged, log)
		if err != nil {
			return nil, err
		}
		d.release = append(d.release, stop)
		placed := func(ref string) (string, string, bool) {
			if d.placing == nil {
				return "", "", false
			}
			return d.placing.Placed(ref)
		}
		rt, err := openRouter(fleetCfg, rs.ClientCA, fleetStore, placed, sessionNode(fleetStore), sessions, cfg.Control, mtr, log)
		if err != nil {
			return nil, err
		}
		if rt != nil {
			d.route = rt
			d.release = append(d.release, func() { _ = rt.Close() })
			// Placement forwards through the router: without a node certificate each node
			// stages where it is asked.
			if d.placing, err = openPlacing(fleetCfg, fleetStore, d.staged, publish, rt, sessions, mtr, log); err != nil {
				return nil, err
			}
		}
	}
	// Before the registry closes: the watchdog's check reads it.
	d.release = append(d.release, sm.stopWatchdog)
	log.Info("sessions recovered", "took", time.Since(recoveryStarted).Round(time.Microsecond).String())
	// Every session is recovered: retention may look at which have ended.
	keep := retention.Policy{MaxEnded: o.retainEnded, MaxAge: o.retainFor}
	sessions.Retain(keep)
	if keep.Enabled() {
		log.Info("retaining ended sessions", "bounds", keep.String())
	}
	d.stateDir, d.trees, d.group, d.pool, d.init, d.cgs = stateDir, trees, group, pool, init, cgs
	d.control = cfg.Control
	d.remote = cfg.Remote
	d.assess, d.catalog = assess, catalog
	d.mtr, d.artifacts, d.spend, d.sessions, d.fds = mtr, artifacts, spend, sessions, fds
	assembled = true
	return d, nil
}
