package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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
	"roost.dev/roost/pkg/fleet/route"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/metrics"
	"roost.dev/roost/pkg/remote"
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
	// nodeCert, nodeKey and peerCA are the node's side of the node-to-node mTLS; no
	// nodeCert, no routed calls. An unset peerCA is the remote listener's client CA.
	nodeCert, nodeKey, peerCA remote.Setting
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
	setting := func(flag, fromFlag, key, fromFile string) remote.Setting {
		if fromFlag != "" {
			return remote.Setting{Value: fromFlag, From: "--" + flag}
		}
		return remote.Setting{Value: fromFile, From: file + ": fleet.node_tls." + key}
	}
	s.nodeCert = setting("fleet-node-cert", o.fleetNodeCert, "cert", f.NodeTLS.Cert)
	s.nodeKey = setting("fleet-node-key", o.fleetNodeKey, "key", f.NodeTLS.Key)
	s.peerCA = setting("fleet-peer-ca", o.fleetPeerCA, "ca", f.NodeTLS.CA)
	switch {
	case len(s.etcd.Endpoints) == 0 && (o.nodeName != "" || o.fleetEtcdCA != "" || o.fleetEtcdCert != "" || o.fleetEtcdKey != "" ||
		o.fleetNodeCert != "" || o.fleetNodeKey != "" || o.fleetPeerCA != ""):
		return s, fmt.Errorf("--node-name, --fleet-etcd-ca/-cert/-key and --fleet-node-cert/-key, --fleet-peer-ca need --fleet-etcd (or fleet.etcd in %s): the etcd cluster of the fleet", file)
	case s.nodeCert.Value != "" && s.nodeKey.Value == "":
		return s, fmt.Errorf("%s %s needs %s too: the certificate's private key", s.nodeCert.From, s.nodeCert.Value, s.nodeKey.From)
	case s.nodeKey.Value != "" && s.nodeCert.Value == "":
		return s, fmt.Errorf("%s %s needs %s too: the certificate it is the key of", s.nodeKey.From, s.nodeKey.Value, s.nodeCert.From)
	case s.peerCA.Value != "" && s.nodeCert.Value == "":
		return s, fmt.Errorf("%s %s needs %s: the certificate this node presents to the other nodes' listeners", s.peerCA.From, s.peerCA.Value, s.nodeCert.From)
	case len(s.etcd.Endpoints) > 0 && s.node == "":
		return s, fmt.Errorf("%s: a fleet node needs a name: give --node-name (or fleet.node_name in %s), unique in the fleet and the same across restarts", s.etcdFrom, file)
	}
	return s, nil
}

func (s fleetSettings) enabled() bool { return len(s.etcd.Endpoints) > 0 }

// nodeTLS is the client side of the node-to-node mTLS: the node's certificate, whose
// Common Name must be its node name (the other nodes' listeners know it by that name), and
// the CA their listeners' certificates chain to (peerCA, else clientCA, the remote
// listener's). Nil, without a node certificate: calls are not routed.
func (s fleetSettings) nodeTLS(clientCA remote.Setting) (*tls.Config, error) {
	if s.nodeCert.Value == "" {
		return nil, nil
	}
	var pe *os.PathError
	if info, err := os.Stat(s.nodeKey.Value); errors.As(err, &pe) {
		return nil, fmt.Errorf("%s %s: %w", s.nodeKey.From, s.nodeKey.Value, pe.Err)
	} else if err != nil {
		return nil, fmt.Errorf("%s %s: %w", s.nodeKey.From, s.nodeKey.Value, err)
	} else if info.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s %s: mode %04o lets others than its owner read the node's private key: chmod 600 it", s.nodeKey.From, s.nodeKey.Value, info.Mode().Perm())
	}
	cert, err := tls.LoadX509KeyPair(s.nodeCert.Value, s.nodeKey.Value)
	if err != nil {
		return nil, fmt.Errorf("%s %s with %s %s: %w", s.nodeCert.From, s.nodeCert.Value, s.nodeKey.From, s.nodeKey.Value, err)
	}
	if cn := cert.Leaf.Subject.CommonName; cn != s.node {
		return nil, fmt.Errorf("%s %s: its Common Name %q is not the node's name %q (%s): a node presents a certificate of its own name, which the other nodes list with role node", s.nodeCert.From, s.nodeCert.Value, cn, s.node, s.nodeNameSet)
	}
	if usage := cert.Leaf.ExtKeyUsage; len(usage) > 0 && !slices.Contains(usage, x509.ExtKeyUsageClientAuth) && !slices.Contains(usage, x509.ExtKeyUsageAny) {
		return nil, fmt.Errorf("%s %s: not a client certificate (no clientAuth extended key usage): the other nodes' listeners would refuse it", s.nodeCert.From, s.nodeCert.Value)
	}
	ca := s.peerCA
	if ca.Value == "" {
		ca = clientCA
	}
	if ca.Value == "" {
		return nil, fmt.Errorf("%s %s: give --fleet-peer-ca (fleet.node_tls.ca), the CA the other nodes' listeners' certificates chain to, or a remote listener with its --client-ca", s.nodeCert.From, s.nodeCert.Value)
	}
	pool, _, err := remote.LoadCA(ca.Value)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", ca.From, ca.Value, err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: pool}, nil
}

// locator is where the router finds a session's node: sessionNode names the node (nil, no
// session directory yet: every session not on this node is unknown), and the node
// directory gives its listener's address.
//
// A session this node placed a moment ago is found where it placed it (placed) before its
// owner's directory entry is written: run's launch follows its stage at once.
func locator(store fleet.Store, placed func(ref string) (string, string, bool), sessionNode func(ctx context.Context, ref string) (string, error)) func(ctx context.Context, ref string) (string, string, error) {
	address := nodeAddress(store)
	return func(ctx context.Context, ref string) (string, string, error) {
		if node, addr, ok := placed(ref); ok {
			return node, addr, nil
		}
		if sessionNode == nil {
			return "", "", fmt.Errorf("session %q: %w", ref, errdefs.ErrNotFound)
		}
		node, err := sessionNode(ctx, ref)
		if err != nil {
			return "", "", err
		}
		addr, err := address(ctx, node)
		if errdefs.IsNotFound(err) {
			// A node the node directory has not heard of: no address to forward to.
			return node, "", nil
		}
		return node, addr, err
	}
}

// sessionNode is the node holding a session, by the fleet's session directory (its full id
// or its name).
func sessionNode(store fleet.Store) func(ctx context.Context, ref string) (string, error) {
	return func(ctx context.Context, ref string) (string, error) {
		s, err := directory.LocateSession(ctx, store, "", ref)
		if err != nil {
			return "", err
		}
		return s.Node, nil
	}
}

// nodeAddress is a node's listener address, from its node directory entry alone.
func nodeAddress(store fleet.Store) func(ctx context.Context, node string) (string, error) {
	return func(ctx context.Context, node string) (string, error) {
		n, err := directory.Lookup(ctx, store, "", node)
		return n.Address, err
	}
}

// openPlacing is a fleet node's Stage: sessions placed over the fleet's nodes and staged
// through the router on the one chosen.
func openPlacing(s fleetSettings, store *etcdstore.Store, staged *placement.Staged, publish func(context.Context) error, rt *route.Router, sessions *session.Manager, mtr *metrics.Metrics, log *slog.Logger) (*placement.Stager, error) {
	placer, err := placement.New(placement.Config{Store: store, Self: s.node, Logger: log.With("part", "fleet-placement")})
	if err != nil {
		return nil, err
	}
	return placement.NewStager(placement.StagerConfig{
		Placer: placer, Staged: staged, Forward: rt, Describe: describeStage(sessions), Publish: publish, Observe: mtr.WatchPlacements(),
		FromNode: func(ctx context.Context) bool {
			c, ok := remote.CallerFrom(ctx)
			return ok && c.Via != ""
		},
		Logger: log.With("part", "fleet-placement"),
	})
}

// openRouter is the router of calls about sessions on other nodes, or nil without a node
// certificate (each node then serves its own sessions only).
func openRouter(s fleetSettings, clientCA remote.Setting, store fleet.Store, placed func(string) (string, string, bool), sessionNode func(context.Context, string) (string, error), sessions *session.Manager, control config.Control, mtr *metrics.Metrics, log *slog.Logger) (*route.Router, error) {
	tlsCfg, err := s.nodeTLS(clientCA)
	if err != nil || tlsCfg == nil {
		return nil, err
	}
	limits := control.WithDefaults()
	r, err := route.New(route.Config{
		Self: s.node,
		Local: func(ref string) bool {
			_, err := sessions.Get(ref)
			return !errdefs.IsNotFound(err)
		},
		Locate:          locator(store, placed, sessionNode),
		NodeAddress:     nodeAddress(store),
		TLS:             tlsCfg,
		Caller:          server.ForwardedCaller(s.node),
		MaxMessageBytes: max(limits.MaxRecvMessageBytes, limits.MaxSendMessageBytes),
		SendTimeout:     limits.StreamSendTimeout(),
		Observe:         mtr.WatchForwarded(),
		Logger:          log.With("part", "fleet-route"),
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.nodeCert.From, err)
	}
	log.Info("routing calls about other nodes' sessions to them", "node", s.node, "certificate", s.nodeCert.Value)
	return r, nil
}

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
//
// The entry counts staged sessions with the running ones (they hold their ids, and are
// about to run) and says the most the node takes, its id pool's slots less the rehearsals'
// one; its writes settle the reservations of the sessions placed here (staged).
//
// The second func writes this node's sessions to the session directory now.
func registerNode(s fleetSettings, store *etcdstore.Store, address string, catalog containment.Catalog, sessions *session.Manager, slots uint32, staged *placement.Staged, log *slog.Logger) (func(), func(context.Context) error, error) {
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
			used := st.Ranges["held"] + st.Ranges[string(sessionstore.RangeFreed)] + st.Ranges[string(sessionstore.RangeQuarantined)]
			return directory.Capacity{CPUs: cpus, MemoryBytes: memory, SessionsRunning: live, MaxSessions: int(slots) - 1, SlotsUsed: used, Warm: st.WarmByShape}
		},
		Settle: staged.Settle,
		Logger: log.With("part", "fleet-directory"),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s.nodeNameSet, err)
	}
	stopPublishing, pub, err := publishSessions(s, store, sessions, log)
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), fleetShutdownTimeout)
		defer cancel()
		_ = reg.Stop(ctx)
		return nil, nil, err
	}
	return func() {
		stopPublishing()
		ctx, cancel := context.WithTimeout(context.Background(), fleetShutdownTimeout)
		defer cancel()
		if err := reg.Stop(ctx); err != nil {
			log.Warn("the node directory: this node's entry was not marked stopped; it is listed unreachable once its lease lapses", "err", err)
		}
	}, pub.Flush, nil
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

// eventsRetryPause is how long the session directory's follower of the event log waits
// before it follows again after the log failed it (compacted past it, say).
const eventsRetryPause = time.Second

// publishSessions keeps this node's sessions in the fleet's session directory: a round
// after every event of the registry (each state change, stage and removal commits one),
// bursts coalesced by the publisher. The returned func stops it after a last round.
func publishSessions(s fleetSettings, etcd *etcdstore.Store, sessions *session.Manager, log *slog.Logger) (func(), *directory.Publisher, error) {
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
		return nil, nil, fmt.Errorf("%s: %w", s.nodeNameSet, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		for ctx.Err() == nil {
			// Replaying the kept events costs a nudge each, coalesced: the first round
			// diffs everything anyway.
			err := sessions.Events(ctx, sessions.OldestKeptEvent(), true, func(sessionstore.Event) error {
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
	}, pub, nil
}

// directorySession is what the fleet's session directory says of a session.
func directorySession(r *sessionstore.Record) directory.Session {
	class := r.Achieved
	if class == "" {
		class = r.Declared
	}
	return directory.Session{ID: r.ID, Name: r.Name, State: string(r.State), Capsule: r.Capsule.Name + "@" + r.Capsule.Version, Class: class,
		CreatedAt: r.CreatedAt, EndedAt: r.EndedAt}
}
