// Package etcdstore answers how the fleet's shared state lives in etcd: it is fleet.Store on an
// etcd v3 cluster, through go.etcd.io/etcd/client/v3, and says how to reach that cluster from
// roostd's flags (endpoints, TLS files, a dial timeout).
package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"roost.dev/roost/pkg/fleet"
)

// Config says how to reach an etcd cluster.
type Config struct {
	// Endpoints are the members' client URLs, http://host:port or https://host:port.
	Endpoints []string
	// CAFile verifies the members' certificates (https endpoints); empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are this client's certificate and key, for members that ask for
	// one (etcd's --client-cert-auth). Both or neither.
	CertFile, KeyFile string
	// DialTimeout bounds connection set-up (etcd's token and version checks). The client
	// connects in the background: New does not wait for a member to answer, so roostd starts
	// while etcd is down, and the first call that needs it reports it.
	DialTimeout time.Duration
	// KeepAlive is how often the client pings a member over an idle connection (gRPC allows
	// no less than 10 s), and how long it then waits for the answer before it drops that
	// member and tries another: how soon a member cut off without a FIN (a partition) is
	// noticed. Zero: DefaultKeepAlive.
	KeepAlive time.Duration
	// Logger takes the client's own log; nil discards it.
	Logger *zap.Logger
}

// DefaultKeepAlive is Config.KeepAlive's default, gRPC's least: a cut-off member is left
// within about twice this.
const DefaultKeepAlive = 10 * time.Second

// ParseEndpoints reads a comma-separated list of client URLs, as --fleet-etcd takes them.
func ParseEndpoints(list string) ([]string, error) {
	var eps []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if err := checkEndpoint(s); err != nil {
			return nil, err
		}
		eps = append(eps, s)
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("etcd endpoints %q: no URL: %w", list, errdefs.ErrInvalidArgument)
	}
	return eps, nil
}

func checkEndpoint(s string) error {
	if !strings.Contains(s, "://") {
		return fmt.Errorf("etcd endpoint %q: want a URL, http://host:port or https://host:port: %w", s, errdefs.ErrInvalidArgument)
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("etcd endpoint %q: %w: %w", s, errdefs.ErrInvalidArgument, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("etcd endpoint %q: scheme %q: want http or https: %w", s, u.Scheme, errdefs.ErrInvalidArgument)
	}
	if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
		return fmt.Errorf("etcd endpoint %q: want host:port after the scheme: %w", s, errdefs.ErrInvalidArgument)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return fmt.Errorf("etcd endpoint %q: a client URL is scheme://host:port, nothing more: %w", s, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Store is fleet.Store on an etcd cluster. Its methods are safe for concurrent use.
type Store struct {
	cli   *clientv3.Client
	owned bool
}

var _ fleet.Store = (*Store)(nil)

// New makes a Store reaching the cluster cfg describes. Close releases it.
func New(cfg Config) (*Store, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("etcd: no endpoints: %w", errdefs.ErrInvalidArgument)
	}
	secure := false
	for _, ep := range cfg.Endpoints {
		if err := checkEndpoint(ep); err != nil {
			return nil, err
		}
		secure = secure || strings.HasPrefix(ep, "https://")
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, fmt.Errorf("etcd client certificate %q and key %q: give both or neither: %w", cfg.CertFile, cfg.KeyFile, errdefs.ErrInvalidArgument)
	}
	tlsFiles := cfg.CAFile != "" || cfg.CertFile != ""
	if tlsFiles && !secure {
		return nil, fmt.Errorf("etcd TLS files given, but no endpoint is https (%s): %w", strings.Join(cfg.Endpoints, ","), errdefs.ErrInvalidArgument)
	}
	for _, f := range []struct{ what, path string }{{"CA", cfg.CAFile}, {"client certificate", cfg.CertFile}, {"client key", cfg.KeyFile}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return nil, fmt.Errorf("etcd %s file %q: %w: %w", f.what, f.path, errdefs.ErrInvalidArgument, err)
		}
	}
	ccfg := clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    cfg.KeepAlive,
		DialKeepAliveTimeout: cfg.KeepAlive,
		PermitWithoutStream:  true,
		Logger:               cfg.Logger,
	}
	if ccfg.DialKeepAliveTime <= 0 {
		ccfg.DialKeepAliveTime, ccfg.DialKeepAliveTimeout = DefaultKeepAlive, DefaultKeepAlive
	}
	if ccfg.Logger == nil {
		ccfg.Logger = zap.NewNop()
	}
	if secure {
		info := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS (CA %q, certificate %q, key %q): %w: %w", cfg.CAFile, cfg.CertFile, cfg.KeyFile, errdefs.ErrInvalidArgument, err)
		}
		ccfg.TLS = tc
	}
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return nil, classify("etcd client for "+strings.Join(cfg.Endpoints, ","), err)
	}
	return &Store{cli: cli, owned: true}, nil
}

// FromClient makes a Store on a client its caller made and keeps: Close leaves it open.
func FromClient(cli *clientv3.Client) *Store { return &Store{cli: cli} }

// Close releases the client New made.
func (s *Store) Close() error {
	if !s.owned {
		return nil
	}
	if err := s.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("closing the etcd client: %w", err)
	}
	return nil
}

// Get reads key (or the keys under it) with a linearizable read: the revision is the
// cluster's when the read was served. Like every call here it requires a leader (see
// leaderOnly).
func (s *Store) Get(ctx context.Context, key string, prefix bool) ([]fleet.KV, int64, error) {
	if key == "" {
		return nil, 0, fmt.Errorf("etcd get: empty key: %w", errdefs.ErrInvalidArgument)
	}
	var opts []clientv3.OpOption
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	resp, err := s.cli.Get(leaderOnly(ctx), key, opts...)
	if err != nil {
		return nil, 0, classify(fmt.Sprintf("etcd get %q", key), err)
	}
	kvs := make([]fleet.KV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		kvs = append(kvs, fleet.KV{Key: string(kv.Key), Value: kv.Value, ModRevision: kv.ModRevision})
	}
	return kvs, resp.Header.Revision, nil
}

// Txn applies then if every compare holds. The client sends a transaction that writes once and
// never resends it, so an error here is ambiguous: classified (errdefs.IsUnavailable for a
// cluster that did not answer in time, with no leader, or whose leader changed), and the
// caller reads to learn what happened.
func (s *Store) Txn(ctx context.Context, cmps []fleet.Cmp, then []fleet.Op) (bool, error) {
	ecmps := make([]clientv3.Cmp, 0, len(cmps))
	for i, c := range cmps {
		switch {
		case c.Key == "":
			return false, fmt.Errorf("etcd txn: compare %d: empty key: %w", i, errdefs.ErrInvalidArgument)
		case c.ModRevision < 0:
			return false, fmt.Errorf("etcd txn: compare %d on %q: revision %d below 0: %w", i, c.Key, c.ModRevision, errdefs.ErrInvalidArgument)
		case c.ModRevision == 0:
			ecmps = append(ecmps, clientv3.Compare(clientv3.CreateRevision(c.Key), "=", 0))
		default:
			ecmps = append(ecmps, clientv3.Compare(clientv3.ModRevision(c.Key), "=", c.ModRevision))
		}
	}
	ops := make([]clientv3.Op, 0, len(then))
	for i, o := range then {
		if o.Key == "" {
			return false, fmt.Errorf("etcd txn: op %d: empty key: %w", i, errdefs.ErrInvalidArgument)
		}
		switch {
		case o.Delete:
			ops = append(ops, clientv3.OpDelete(o.Key))
		case o.Lease != 0:
			ops = append(ops, clientv3.OpPut(o.Key, string(o.Value), clientv3.WithLease(clientv3.LeaseID(o.Lease))))
		default:
			ops = append(ops, clientv3.OpPut(o.Key, string(o.Value)))
		}
	}
	for {
		resp, err := s.cli.Txn(leaderOnly(ctx)).If(ecmps...).Then(ops...).Commit()
		switch {
		case err == nil:
			return resp.Succeeded, nil
		case !errors.Is(err, rpctypes.ErrNoLeader):
			return false, classify(fmt.Sprintf("etcd txn on %s (outcome unknown)", txnKeys(cmps, then)), err)
		}
		// A member refuses a call that requires a leader before it handles it: the Txn was
		// not applied, and the next try goes to the next member. The pause is the client's
		// own between retried reads, so that a cluster electing is not asked in a spin.
		select {
		case <-ctx.Done():
			return false, classify(fmt.Sprintf("etcd txn on %s (not applied)", txnKeys(cmps, then)), err)
		case <-time.After(noLeaderPause):
		}
	}
}

// noLeaderPause is how long Txn waits before it tries again a Txn a member refused for want
// of a leader: clientv3's own wait between retried reads.
const noLeaderPause = 25 * time.Millisecond

// leaderOnly makes a call fail at once on a member that knows of no leader, as one cut off
// from the others does an election timeout after the cut, rather than wait there for its
// deadline. The client takes a read so refused to the next member; a Txn comes back
// unavailable and its caller tries again, on the next member too (the client balances
// round-robin). Without it, every call the balancer sends to the cut-off member fails by
// its deadline, and a caller that makes a few calls in a row fails nearly every time.
func leaderOnly(ctx context.Context) context.Context { return clientv3.WithRequireLeader(ctx) }

// txnKeys names a transaction's keys for its errors.
func txnKeys(cmps []fleet.Cmp, then []fleet.Op) string {
	seen := map[string]bool{}
	var keys []string
	for _, c := range cmps {
		if !seen[c.Key] {
			seen[c.Key] = true
			keys = append(keys, fmt.Sprintf("%q", c.Key))
		}
	}
	for _, o := range then {
		if !seen[o.Key] {
			seen[o.Key] = true
			keys = append(keys, fmt.Sprintf("%q", o.Key))
		}
	}
	return strings.Join(keys, ", ")
}

// Watch reports changes after revision. It requires a leader: a member cut off from the
// others ends the watch (the channel closes) rather than go quiet while the rest of the
// cluster moves on. A compacted revision also closes it, at once; the watcher's Get then
// starts it afresh.
func (s *Store) Watch(ctx context.Context, key string, prefix bool, revision int64) <-chan []fleet.KV {
	out := make(chan []fleet.KV)
	if key == "" || revision < 0 {
		close(out)
		return out
	}
	var opts []clientv3.OpOption
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	if revision > 0 {
		opts = append(opts, clientv3.WithRev(revision+1))
	}
	wctx, cancel := context.WithCancel(leaderOnly(ctx))
	wch := s.cli.Watch(wctx, key, opts...)
	go func() {
		defer close(out)
		defer cancel()
		for resp := range wch {
			if resp.Canceled || resp.Err() != nil {
				return
			}
			if len(resp.Events) == 0 {
				continue // a progress notification
			}
			batch := make([]fleet.KV, 0, len(resp.Events))
			for _, ev := range resp.Events {
				kv := fleet.KV{Key: string(ev.Kv.Key), ModRevision: ev.Kv.ModRevision}
				if ev.Type == mvccpb.Event_DELETE {
					kv.Deleted = true
				} else {
					kv.Value = ev.Kv.Value
				}
				batch = append(batch, kv)
			}
			select {
			case out <- batch:
			case <-wctx.Done():
				return
			}
		}
	}()
	return out
}

// classify wraps err, from the client, with what it was doing and an errdefs class. A
// deadline that passed while the cluster did not answer counts as unavailable too: to the
// fleet, a cluster that does not answer in time is one it cannot reach.
func classify(what string, err error) error {
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, clientv3.ErrNoAvailableEndpoints) {
		return fmt.Errorf("%s: %w: %w", what, errdefs.ErrUnavailable, err)
	}
	var class error = errdefs.ErrUnknown
	switch grpcCode(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		class = errdefs.ErrUnavailable
	case codes.Canceled:
		return fmt.Errorf("%s: %w: %w", what, context.Canceled, err)
	case codes.InvalidArgument:
		class = errdefs.ErrInvalidArgument
	case codes.OutOfRange:
		class = errdefs.ErrOutOfRange
	case codes.ResourceExhausted:
		class = errdefs.ErrResourceExhausted
	case codes.PermissionDenied:
		class = errdefs.ErrPermissionDenied
	case codes.Unauthenticated:
		class = errdefs.ErrUnauthenticated
	case codes.FailedPrecondition:
		class = errdefs.ErrFailedPrecondition
	case codes.NotFound:
		class = errdefs.ErrNotFound
	case codes.DataLoss:
		class = errdefs.ErrDataLoss
	}
	return fmt.Errorf("%s: %w: %w", what, class, err)
}

func grpcCode(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return codes.Unknown
}
