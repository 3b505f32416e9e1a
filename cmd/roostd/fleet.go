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

	"github.com/containerd/errdefs"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/directory"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/fleet/placement"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/metrics"
	"roost.dev/roost/pkg/server"
	"roost.dev/roost/pkg/session"
	sessionstore "roost.dev/roost/pkg/session/store"
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
// sessions and the warm pool. It does not wait for etcd. The returned func stops it: a
// clean stop marks the entry stopped and revokes its lease, so the fleet sees at once that
// the node went away on purpose (it is not cut off, and needs no forgetting), while what
// it said stays listed until it starts again or is forgotten.
//
// The entry counts staged sessions with the running ones (they hold their ids, and are
// about to run) and says the most the node takes, its id pool's slots less the rehearsals'
// one; its writes settle the reservations of the sessions placed here (staged).
func registerNode(s fleetSettings, store *etcdstore.Store, address string, catalog containment.Catalog, sessions *session.Manager, slots uint32, staged *placement.Staged, log *slog.Logger) (func(), error) {
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
				if state.Live() || state == sessionstore.Staged {
					live += n
				}
			}
			return directory.Capacity{CPUs: cpus, MemoryBytes: memory, SessionsRunning: live, MaxSessions: int(slots) - 1, Warm: st.WarmByShape}
		},
		Settle: staged.Settle,
		Logger: log.With("part", "fleet-directory"),
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.nodeNameSet, err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), fleetShutdownTimeout)
		defer cancel()
		if err := reg.Stop(ctx); err != nil {
			log.Warn("the node directory: this node's entry was not marked stopped; it is listed unreachable once its lease lapses", "err", err)
		}
	}, nil
}

// describeStage is what placement reads of a stage request on the entry node: the capsule's
// declared class and warm shapes, as this node reads it. A capsule this node cannot find
// (a directory or a push only the other nodes have) is placed by the request's class alone:
// the node chosen reads it, and refuses it if it must.
func describeStage(m *session.Manager) placement.Describe {
	return func(req *roostv1.StageRequest) (placement.Need, error) {
		opts := session.StageOptions{Capsule: req.GetCapsule()}
		if c := req.GetContainment(); c != "" {
			class, err := manifest.ParseClass(c)
			if err != nil {
				return placement.Need{}, fmt.Errorf("containment: %v: %w", err, errdefs.ErrInvalidArgument)
			}
			opts.Containment = class
		}
		floor, shapes, err := m.Needs(opts)
		switch {
		case errdefs.IsNotFound(err):
			return placement.Need{Class: req.GetContainment()}, nil
		case err != nil:
			return placement.Need{}, err
		}
		need := placement.Need{Shapes: shapes}
		if floor != manifest.ClassNone {
			need.Class = floor.String()
		}
		return need, nil
	}
}
