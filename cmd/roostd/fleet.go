package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/metrics"
	"roost.dev/roost/pkg/server"
	"roost.dev/roost/pkg/session"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/version"
)

// fleetShutdownTimeout bounds how long a stopping roostd spends giving back the tokens it
// holds unspent; what it could not give back it keeps for its next run.
const fleetShutdownTimeout = 10 * time.Second

// fleetSettings are the fleet flags over the config's fleet section, each error naming the
// flag or key it came from. Zero Endpoints: roostd is a single host.
type fleetSettings struct {
	etcd        etcdstore.Config
	node        string
	etcdFrom    string
	nodeNameSet string
}

func fleetFromOptions(o *options, f config.Fleet) (fleetSettings, error) {
	file := o.configFile
	if file == "" {
		file = "the configuration (no --config)"
	}
	s := fleetSettings{node: f.NodeName, nodeNameSet: file + ": fleet.node_name", etcdFrom: file + ": fleet.etcd"}
	s.etcd.Endpoints = f.Etcd
	if o.fleetEtcd != "" {
		eps, err := etcdstore.ParseEndpoints(o.fleetEtcd)
		if err != nil {
			return s, fmt.Errorf("--fleet-etcd: %w", err)
		}
		s.etcd.Endpoints, s.etcdFrom = eps, "--fleet-etcd"
	}
	if o.nodeName != "" {
		s.node, s.nodeNameSet = o.nodeName, "--node-name"
	}
	pick := func(flag, key string) string {
		if flag != "" {
			return flag
		}
		return key
	}
	s.etcd.CAFile = pick(o.fleetEtcdCA, f.EtcdCA)
	s.etcd.CertFile = pick(o.fleetEtcdCert, f.EtcdCert)
	s.etcd.KeyFile = pick(o.fleetEtcdKey, f.EtcdKey)
	switch {
	case len(s.etcd.Endpoints) == 0 && (o.nodeName != "" || o.fleetEtcdCA != "" || o.fleetEtcdCert != "" || o.fleetEtcdKey != ""):
		return s, fmt.Errorf("--node-name and --fleet-etcd-ca/-cert/-key need --fleet-etcd (or fleet.etcd in %s): the etcd cluster of the fleet", file)
	case len(s.etcd.Endpoints) > 0 && s.node == "":
		return s, fmt.Errorf("%s: a fleet node needs a name: give --node-name (or fleet.node_name in %s), unique in the fleet and the same across restarts", s.etcdFrom, file)
	}
	return s, nil
}

func (s fleetSettings) enabled() bool { return len(s.etcd.Endpoints) > 0 }

// openFleet opens the store and the node handing the ledger its allowance. The node needs
// no reachable etcd to open: cut off, it spends what it holds.
func openFleet(s fleetSettings, stateDir string, spend *ledger.Ledger, mtr *metrics.Metrics, log *slog.Logger) (*server.Fleet, *etcdstore.Store, func(), error) {
	store, err := etcdstore.New(s.etcd)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s %s: %w", s.etcdFrom, strings.Join(s.etcd.Endpoints, ","), err)
	}
	// The metrics wrap the store the node is opened on, so they exist before the node does.
	var opened atomic.Pointer[fleet.Node]
	watched := mtr.WatchFleet(store, func() fleet.Status {
		if n := opened.Load(); n != nil {
			return n.Status()
		}
		return fleet.Status{Pool: -1, Ceiling: -1}
	})
	node, err := fleet.Open(fleet.Config{Store: watched, Node: s.node, StateDir: stateDir, Ledger: spend, Logger: log.With("part", "fleet")})
	if err != nil {
		store.Close()
		return nil, nil, nil, fmt.Errorf("%s: fleet node %q: %w", s.nodeNameSet, s.node, err)
	}
	opened.Store(node)
	log.Info("a node of the fleet ledger", "node", s.node, "etcd", strings.Join(s.etcd.Endpoints, ","), "state", filepath.Join(stateDir, fleet.File))
	release := func() {
		ctx, cancel := context.WithTimeout(context.Background(), fleetShutdownTimeout)
		defer cancel()
		if err := node.Shutdown(ctx); err != nil {
			log.Warn("the fleet node kept tokens it could not give back; it gives them back on its next run", "err", err)
		}
		store.Close()
	}
	return &server.Fleet{Store: watched, Node: s.node, Status: node.Status}, store, release, nil
}

// registerNode puts this node in the fleet's node directory, kept up to date from the
// sessions and the warm pool, and publishes its sessions in the session directory. It does
// not wait for etcd. The returned func stops both: a clean stop writes the sessions as
// they are, marks the entry stopped and revokes its lease, so the fleet sees at once that
// the node went away on purpose (it is not cut off, and needs no forgetting), while what
// it said stays listed until it starts again or is forgotten.
func registerNode(s fleetSettings, store *etcdstore.Store, address string, catalog containment.Catalog, sessions *session.Manager, log *slog.Logger) (func(), error) {
	var classes []string
	for _, c := range catalog.Delivers() {
		classes = append(classes, c.String())
	}
	var memory int64
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err == nil {
		memory = int64(si.Totalram) * int64(si.Unit)
	}
	cpus := runtime.NumCPU()
	reg, err := directory.Register(directory.Config{
		Store: store, Node: s.node, Address: address, Classes: classes, StartedAt: time.Now(), Version: version.Version,
		Capacity: func() directory.Capacity {
			st := sessions.Status()
			live := 0
			for state, n := range st.ByState {
				if state.Live() {
					live += n
				}
			}
			return directory.Capacity{CPUs: cpus, MemoryBytes: memory, SessionsRunning: live, Warm: st.WarmByShape}
		},
		Logger: log.With("part", "fleet-directory"),
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.nodeNameSet, err)
	}
	stopPublishing, err := publishSessions(s, store, sessions, log)
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), fleetShutdownTimeout)
		defer cancel()
		_ = reg.Stop(ctx)
		return nil, err
	}
	return func() {
		stopPublishing()
		ctx, cancel := context.WithTimeout(context.Background(), fleetShutdownTimeout)
		defer cancel()
		if err := reg.Stop(ctx); err != nil {
			log.Warn("the node directory: this node's entry was not marked stopped; it is listed unreachable once its lease lapses", "err", err)
		}
	}, nil
}

// eventsRetryPause is how long the session directory's follower of the event log waits
// before it follows again after the log failed it (compacted past it, say).
const eventsRetryPause = time.Second

// publishSessions keeps this node's sessions in the fleet's session directory: a round
// after every event of the registry (each state change, stage and removal commits one),
// bursts coalesced by the publisher. The returned func stops it after a last round.
func publishSessions(s fleetSettings, etcd *etcdstore.Store, sessions *session.Manager, log *slog.Logger) (func(), error) {
	pub, err := directory.PublishSessions(directory.SessionsConfig{
		Store: etcd, Node: s.node, Logger: log.With("part", "fleet-sessions"),
		List: func() ([]directory.Session, error) {
			recs, err := sessions.List(true)
			if err != nil {
				return nil, err
			}
			out := make([]directory.Session, 0, len(recs))
			for _, r := range recs {
				out = append(out, directorySession(r))
			}
			return out, nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.nodeNameSet, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		for ctx.Err() == nil {
			// Replaying the kept events costs a nudge each, coalesced: the first round
			// diffs everything anyway.
			err := sessions.Events(ctx, sessions.OldestKeptEvent(), true, func(store.Event) error {
				pub.Nudge()
				return nil
			})
			if ctx.Err() != nil {
				return
			}
			log.Debug("the session directory: following the event log again", "err", err)
			pub.Nudge()
			select {
			case <-ctx.Done():
			case <-time.After(eventsRetryPause):
			}
		}
	}()
	return func() {
		cancel()
		<-followed
		ctx, cancel := context.WithTimeout(context.Background(), fleetShutdownTimeout)
		defer cancel()
		if err := pub.Stop(ctx); err != nil {
			log.Warn("the session directory: this node's sessions were not all written as they are; the fleet lists them as last written", "err", err)
		}
	}, nil
}

// directorySession is what the fleet's session directory says of a session.
func directorySession(r *store.Record) directory.Session {
	class := r.Achieved
	if class == "" {
		class = r.Declared
	}
	return directory.Session{ID: r.ID, Name: r.Name, State: string(r.State), Capsule: r.Capsule.Name + "@" + r.Capsule.Version, Class: class,
		CreatedAt: r.CreatedAt, EndedAt: r.EndedAt}
}
