// Package server is roostd's gRPC API: each service forwards to the package that owns the
// work, and every error leaves through ToStatus.
package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/dirs"
	"roost.dev/roost/pkg/session/retention"
	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/artifact"
	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/fdbudget"
	"roost.dev/roost/pkg/ledger"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session"
	"roost.dev/roost/pkg/version"
)

// Config is what the services need.
type Config struct {
	Sessions *session.Manager
	// Artifacts is the store push and artifacts use.
	Artifacts *artifact.Store
	// Ledger is the token ledger spend reads and sets; nil for none.
	Ledger *ledger.Ledger
	// Assess probes the host and rehearses the classes the daemon can run, afresh.
	Assess   func(context.Context) (containment.Host, containment.Catalog)
	StateDir string
	// SessionTrees are the directories sessions write in on the host, which doctor checks
	// are on nosuid,nodev mounts; dirs.Trees(StateDir) when nil.
	SessionTrees []string
	StartedAt    time.Time
	Logger       *slog.Logger
	// Peers is who may call: every connection's peer is checked against it, and one it
	// refuses, or that was not checked, is served nothing. Nil serves anyone (tests only).
	Peers *PeerPolicy
	// IDs is the block of host ids sessions run as, which doctor checks can be mapped and
	// is held by nobody else; the default block when zero.
	IDs store.IDPool
	// Limits bound streams, messages and unread sends (the operator's control section);
	// each unset one takes its default.
	Limits config.Control
	// Descriptors is roostd's descriptor budget, which doctor reports; nil for none.
	Descriptors *fdbudget.Budget
	// Fleet is the fleet ledger this roostd is a node of; nil when it is a single host.
	Fleet *Fleet
	// Placing places the sessions staged on a fleet node; nil on a single host, where a
	// stage naming a node is refused.
	Placing Placing
	// Route carries calls about sessions on other nodes of the fleet there
	// (pkg/fleet/route); nil serves every call here.
	Route Router
}

// Placing is a fleet node's Stage (pkg/fleet/placement's Stager): the request staged here
// through local, or on the node it places it on.
type Placing interface {
	Stage(ctx context.Context, req *roostv1.StageRequest, local func(context.Context, *roostv1.StageRequest) (*roostv1.StageResponse, error)) (*roostv1.StageResponse, error)
}

// Router is what carries calls to other nodes: interceptors that serve a call here or
// forward it. They run last, after the peer check (a refused caller is forwarded nothing)
// and after the stream bounds (a forwarded stream counts against this node's).
type Router interface {
	UnaryInterceptor() grpc.UnaryServerInterceptor
	StreamInterceptor() grpc.StreamServerInterceptor
}

// Server is roostd's gRPC server: roost's services, the standard health service
// (grpc.health.v1) and server reflection, all behind the same peer check.
type Server struct {
	*grpc.Server
	health *health.Server
	// services are the names whose health follows the daemon's readiness: roost's own.
	services []string
	// mu orders readiness changes; stopped makes SetNotServing final.
	mu      sync.Mutex
	stopped bool
	streams *streamSet
}

// Keepalive bounds. Clients may ping an idle connection (roostctl's followers of logs and
// events sit idle for long) but no more often than MinPingInterval; a client pinging
// faster is sent GOAWAY. The server pings a connection idle for ServerPingAfter and drops
// it when no answer comes within ServerPingTimeout: a peer that stopped reading frees what
// it held.
const (
	MinPingInterval   = 10 * time.Second
	ServerPingAfter   = 2 * time.Minute
	ServerPingTimeout = 20 * time.Second
)

// New returns a gRPC server with every roost service registered, health reporting
// NOT_SERVING for all of them (and for the server as a whole, "") until SetServing.
func New(cfg Config) *Server {
	limits := cfg.Limits.WithDefaults()
	if cfg.Logger != nil {
		cfg.Logger.Info("control API bounds", "max_streams", limits.MaxStreams, "max_streams_per_client", limits.MaxStreamsPerClient,
			"max_recv_message_bytes", limits.MaxRecvMessageBytes, "max_send_message_bytes", limits.MaxSendMessageBytes,
			"stream_send_timeout", limits.StreamSendTimeout().String())
	}
	unary := []grpc.UnaryServerInterceptor{unaryInterceptor(cfg.Logger)}
	streams := newStreamSet(streamBounds{total: limits.MaxStreams, perClient: limits.MaxStreamsPerClient})
	stream := []grpc.StreamServerInterceptor{streamInterceptor(cfg.Logger, streams)}
	opts := []grpc.ServerOption{
		// Bound what one message may carry, each way: roost's requests are small, and
		// what roostd sends stays within a client's default receive bound.
		grpc.MaxRecvMsgSize(limits.MaxRecvMessageBytes),
		grpc.MaxSendMsgSize(limits.MaxSendMessageBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: MinPingInterval, PermitWithoutStream: true}),
		// No MaxConnectionAge: a follower's stream lives as long as its operator wants it.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: ServerPingAfter, Timeout: ServerPingTimeout}),
	}
	if cfg.Peers != nil {
		log := cfg.Logger
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		opts = append(opts, grpc.Creds(&peerCreds{policy: *cfg.Peers, log: log}))
		unary = append([]grpc.UnaryServerInterceptor{peerUnaryInterceptor}, unary...)
		stream = append([]grpc.StreamServerInterceptor{peerStreamInterceptor}, stream...)
	}
	if cfg.Route != nil {
		unary = append(unary, cfg.Route.UnaryInterceptor())
		stream = append(stream, cfg.Route.StreamInterceptor())
	}
	opts = append(opts, grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))
	srv := grpc.NewServer(opts...)
	ss := &sessionService{m: cfg.Sessions, sendTimeout: limits.StreamSendTimeout(), placing: cfg.Placing, fleetNode: cfg.Fleet}
	if cfg.Fleet != nil {
		ss.node = cfg.Fleet.Node
	}
	roostv1.RegisterSessionServiceServer(srv, ss)
	roostv1.RegisterCapsuleServiceServer(srv, &capsuleService{m: cfg.Sessions})
	roostv1.RegisterSystemServiceServer(srv, &systemService{cfg: cfg})
	roostv1.RegisterArtifactServiceServer(srv, &artifactService{store: cfg.Artifacts})
	roostv1.RegisterFilesServiceServer(srv, &filesService{m: cfg.Sessions, sendTimeout: limits.StreamSendTimeout()})
	roostv1.RegisterSpendServiceServer(srv, &spendService{ledger: cfg.Ledger, fleetNode: cfg.Fleet, recordsDir: func(id string) (string, error) {
		rec, err := cfg.Sessions.Get(id)
		if err != nil {
			return "", err
		}
		return rec.RecordsDir, nil
	}})
	s := &Server{Server: srv, health: health.NewServer(), streams: streams}
	for name := range srv.GetServiceInfo() {
		s.services = append(s.services, name)
	}
	slices.Sort(s.services)
	// The health server starts with "" SERVING; nothing is until the daemon says so.
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	for _, name := range s.services {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	// Registered on the same server, so the same peer check and interceptors guard them.
	healthpb.RegisterHealthServer(srv, s.health)
	reflection.Register(srv)
	return s
}

// SetServing reports every service, and the server as a whole, SERVING: the daemon has
// recovered its sessions and serves.
func (s *Server) SetServing() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped {
		s.health.Resume()
	}
}

// SetNotServing reports every service NOT_SERVING for good: the daemon is shutting down.
// Watchers hear it before their streams end.
func (s *Server) SetNotServing() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	s.health.Shutdown()
}

type sessionService struct {
	roostv1.UnimplementedSessionServiceServer
	m *session.Manager
	// sendTimeout is how long a follower's message may wait unread before the stream ends.
	sendTimeout time.Duration
	// node is this roostd's name in the fleet, and placing its Stage; "" and nil on a
	// single host.
	node    string
	placing Placing
	// fleetNode is the fleet this roostd is a node of, whose session directory ListFleet
	// reads; nil when it is none.
	fleetNode *Fleet
}

var _ roostv1.SessionServiceServer = (*sessionService)(nil)

func stageOptions(capsule, workdir, class string, deadline *durationpb.Duration) (session.StageOptions, error) {
	opts := session.StageOptions{Capsule: capsule, Workdir: workdir}
	if class != "" {
		c, err := manifest.ParseClass(class)
		if err != nil {
			return opts, fmt.Errorf("containment: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		opts.Containment = c
	}
	if deadline != nil {
		if err := deadline.CheckValid(); err != nil {
			return opts, fmt.Errorf("deadline: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		opts.Deadline = deadline.AsDuration()
		if opts.Deadline <= 0 {
			return opts, fmt.Errorf("deadline %s: must be positive: %w", opts.Deadline, errdefs.ErrInvalidArgument)
		}
	}
	return opts, nil
}

func (s *sessionService) Stage(ctx context.Context, req *roostv1.StageRequest) (*roostv1.StageResponse, error) {
	if s.placing != nil {
		return s.placing.Stage(ctx, req, s.stageHere)
	}
	if (req.GetNode() != "" && req.GetNode() != s.node) || req.GetPlacement() != nil {
		return nil, fmt.Errorf("node %q: this roostd places no sessions (a single host, or a fleet node without --fleet-node-cert): stage without --node, or on that node: %w", req.GetNode(), errdefs.ErrFailedPrecondition)
	}
	return s.stageHere(ctx, req)
}

func orSingleHost(node string) string {
	if node == "" {
		return "a single host, no fleet node"
	}
	return "node " + node
}

// stageHere stages req on this node.
func (s *sessionService) stageHere(ctx context.Context, req *roostv1.StageRequest) (*roostv1.StageResponse, error) {
	opts, err := stageOptions(req.GetCapsule(), req.GetWorkdir(), req.GetContainment(), req.GetDeadline())
	if err != nil {
		return nil, err
	}
	opts.Name = req.GetName()
	// Planning refuses one below 0, or above the capsule's.
	opts.MemoryBytes = req.GetMemoryBytes()
	// Staging refuses labels that break a rule, naming the label.
	opts.Labels = req.GetLabels()
	if p := req.GetPlacement(); p != nil {
		opts.Placement = placementRecord(p)
	}
	rec, err := s.m.Stage(opts)
	if err != nil {
		return nil, err
	}
	return &roostv1.StageResponse{Session: s.session(rec)}, nil
}

func (s *sessionService) Launch(ctx context.Context, req *roostv1.LaunchRequest) (*roostv1.LaunchResponse, error) {
	rec, err := s.m.Launch(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &roostv1.LaunchResponse{Session: s.record(rec)}, nil
}

// record is a record as the API shows it, with this node's name.
func (s *sessionService) record(rec *store.Record) *roostv1.Session {
	out := SessionProto(rec)
	out.Node = s.node
	return out
}

// session is a record as the API shows it, with what it uses now when it is live.
func (s *sessionService) session(rec *store.Record) *roostv1.Session {
	out := s.record(rec)
	if rec.State.Live() {
		if u := s.m.Usage(rec); u != nil {
			out.Usage = &roostv1.Usage{MemoryBytes: u.MemoryBytes, MemoryPeakBytes: u.MemoryPeakBytes, CpuSeconds: u.CPUSeconds, Pids: u.Pids,
				MemoryLimitBytes: u.MemoryLimitBytes, PidsLimit: u.PidsLimit, WorkdirBytes: u.WorkdirBytes}
		}
		if t, active, ok := s.m.EgressNow(rec.ID); ok {
			out.Egress = EgressProto(t, active)
		}
	}
	return out
}

func (s *sessionService) Get(ctx context.Context, req *roostv1.GetRequest) (*roostv1.GetResponse, error) {
	rec, err := s.m.Get(req.GetId())
	if err != nil {
		return nil, err
	}
	return &roostv1.GetResponse{Session: s.session(rec)}, nil
}

func (s *sessionService) Pause(ctx context.Context, req *roostv1.PauseRequest) (*roostv1.PauseResponse, error) {
	rec, err := s.m.Pause(req.GetId())
	if err != nil {
		return nil, err
	}
	return &roostv1.PauseResponse{Session: s.session(rec)}, nil
}

func (s *sessionService) Resume(ctx context.Context, req *roostv1.ResumeRequest) (*roostv1.ResumeResponse, error) {
	rec, err := s.m.Resume(req.GetId())
	if err != nil {
		return nil, err
	}
	return &roostv1.ResumeResponse{Session: s.session(rec)}, nil
}

func (s *sessionService) List(ctx context.Context, req *roostv1.ListRequest) (*roostv1.ListResponse, error) {
	sels, err := store.ParseSelectors(req.GetLabel())
	if err != nil {
		return nil, err
	}
	recs, err := s.m.List(req.GetAll(), sels...)
	if err != nil {
		return nil, err
	}
	resp := &roostv1.ListResponse{Sessions: make([]*roostv1.Session, len(recs))}
	for i, rec := range recs {
		resp.Sessions[i] = s.session(rec)
	}
	return resp, nil
}

func (s *sessionService) Wait(ctx context.Context, req *roostv1.WaitRequest) (*roostv1.WaitResponse, error) {
	rec, err := s.m.Wait(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &roostv1.WaitResponse{Session: s.record(rec)}, nil
}

func (s *sessionService) Stop(ctx context.Context, req *roostv1.StopRequest) (*roostv1.StopResponse, error) {
	grace := session.DefaultStopGrace
	if g := req.GetGrace(); g != nil {
		if err := g.CheckValid(); err != nil || g.AsDuration() < 0 {
			return nil, fmt.Errorf("grace: must be a duration of 0 or more: %w", errdefs.ErrInvalidArgument)
		}
		grace = g.AsDuration()
	}
	// The reason lands in the session's one-line detail: bounded, and on one line.
	if r := req.GetReason(); len(r) > 200 || strings.ContainsFunc(r, unicode.IsControl) {
		return nil, fmt.Errorf("reason: at most 200 bytes of text on one line: %w", errdefs.ErrInvalidArgument)
	}
	rec, err := s.m.Stop(ctx, req.GetId(), grace, req.GetReason())
	if err != nil {
		return nil, err
	}
	return &roostv1.StopResponse{Session: s.record(rec)}, nil
}

func (s *sessionService) Kill(ctx context.Context, req *roostv1.KillRequest) (*roostv1.KillResponse, error) {
	sig, err := ParseSignal(req.GetSignal())
	if err != nil {
		return nil, err
	}
	rec, err := s.m.Kill(ctx, req.GetId(), sig)
	if err != nil {
		return nil, err
	}
	return &roostv1.KillResponse{Session: s.record(rec)}, nil
}

// ParseSignal reads a signal as operators write it: "KILL", "SIGKILL", "sigkill" or "9".
// Empty means SIGKILL.
func ParseSignal(s string) (syscall.Signal, error) {
	if s == "" {
		return syscall.SIGKILL, nil
	}
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err == nil && fmt.Sprint(n) == s {
		if n <= 0 || n > 64 {
			return 0, fmt.Errorf("signal %s: out of range 1-64: %w", s, errdefs.ErrInvalidArgument)
		}
		return syscall.Signal(n), nil
	}
	name := s
	if len(name) < 3 || !equalFold(name[:3], "SIG") {
		name = "SIG" + name
	}
	for i := 1; i <= 64; i++ {
		if n := unix.SignalName(syscall.Signal(i)); n != "" && equalFold(n, name) {
			return syscall.Signal(i), nil
		}
	}
	return 0, fmt.Errorf("signal %q: not a signal name or number: %w", s, errdefs.ErrInvalidArgument)
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(a) {
		x, y := a[i], b[i]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

func (s *sessionService) Remove(ctx context.Context, req *roostv1.RemoveRequest) (*roostv1.RemoveResponse, error) {
	if err := s.m.RemoveTree(ctx, req.GetId(), req.GetForce()); err != nil {
		return nil, err
	}
	return &roostv1.RemoveResponse{}, nil
}

func (s *sessionService) Logs(req *roostv1.LogsRequest, stream grpc.ServerStreamingServer[roostv1.LogsResponse]) error {
	opts, err := logOptions(req)
	if err != nil {
		return err
	}
	return sendBounded(s.sendTimeout, stream.Send, func(send func(*roostv1.LogsResponse) error) error {
		return s.m.Logs(stream.Context(), req.GetId(), opts, func(c records.LogChunk) error {
			// The reader reuses its buffer, and the chunk is sent after this returns.
			c.Data = bytes.Clone(c.Data)
			return send(logChunkProto(c))
		})
	})
}

func (s *sessionService) Events(req *roostv1.EventsRequest, stream grpc.ServerStreamingServer[roostv1.EventsResponse]) error {
	if n := req.GetNode(); n != "" && n != s.node {
		// A fleet node's router forwards a call for another node before it gets here.
		return fmt.Errorf("node %q: this roostd is %s: %w", n, orSingleHost(s.node), errdefs.ErrNotFound)
	}
	since := req.GetSince()
	if since == 0 && req.GetFromOldestKept() {
		since = s.m.OldestKeptEvent()
	}
	return sendBounded(s.sendTimeout, stream.Send, func(send func(*roostv1.EventsResponse) error) error {
		return s.m.Events(stream.Context(), since, req.GetFollow(), func(ev store.Event) error {
			e := EventProto(&ev)
			e.Node = s.node
			return send(&roostv1.EventsResponse{Event: e})
		})
	})
}

func (s *sessionService) Prune(ctx context.Context, req *roostv1.PruneRequest) (*roostv1.PruneResponse, error) {
	var until time.Duration
	if u := req.GetUntil(); u != nil {
		if err := u.CheckValid(); err != nil || u.AsDuration() < 0 {
			return nil, fmt.Errorf("until: must be a duration of 0 or more: %w", errdefs.ErrInvalidArgument)
		}
		until = u.AsDuration()
	}
	res, err := s.m.Prune(until, req.GetDryRun())
	if err != nil {
		return nil, err
	}
	pruned := func(p retention.Pruned) *roostv1.PrunedSession {
		rec := SessionProto(p.Record)
		return &roostv1.PrunedSession{Id: rec.GetId(), Capsule: rec.GetCapsule(), EndedAt: rec.GetEndedAt(), ExitStatus: rec.GetExitStatus(), Bytes: p.Bytes, KeptBecause: p.Why}
	}
	resp := &roostv1.PruneResponse{Bytes: res.Bytes, EventsCompacted: int64(res.EventsCompacted), DryRun: req.GetDryRun()}
	for _, p := range res.Removed {
		resp.Removed = append(resp.Removed, pruned(p))
	}
	for _, p := range res.Kept {
		resp.Kept = append(resp.Kept, pruned(p))
	}
	return resp, nil
}

type capsuleService struct {
	roostv1.UnimplementedCapsuleServiceServer
	m *session.Manager
}

var _ roostv1.CapsuleServiceServer = (*capsuleService)(nil)

func (s *capsuleService) Explain(ctx context.Context, req *roostv1.ExplainRequest) (*roostv1.ExplainResponse, error) {
	if ref := req.GetSession(); ref != "" {
		if req.GetCapsule() != "" || req.GetContainment() != "" || req.GetDeadline() != nil || req.GetOci() {
			return nil, fmt.Errorf("session %q: a session is explained as it was staged; capsule, containment, deadline and oci are for explaining a capsule: %w", ref, errdefs.ErrInvalidArgument)
		}
		rec, e, err := s.m.Explained(ref)
		if err != nil {
			return nil, err
		}
		return &roostv1.ExplainResponse{Explanation: e, Session: SessionProto(rec)}, nil
	}
	opts, err := stageOptions(req.GetCapsule(), "", req.GetContainment(), req.GetDeadline())
	if err != nil {
		return nil, err
	}
	e, config, err := s.m.Explain(opts, req.GetOci())
	if err != nil {
		return nil, err
	}
	return &roostv1.ExplainResponse{Explanation: e, OciConfig: string(config)}, nil
}

type artifactService struct {
	roostv1.UnimplementedArtifactServiceServer
	store *artifact.Store
}

var _ roostv1.ArtifactServiceServer = (*artifactService)(nil)

func artifactProto(a artifact.Artifact) *roostv1.Artifact {
	return &roostv1.Artifact{Name: a.Name, Version: a.Version, Sha256: a.SHA256, PushedAt: timestamppb.New(a.PushedAt), Files: int64(a.Files), Bytes: a.Bytes}
}

func (s *artifactService) Push(ctx context.Context, req *roostv1.PushRequest) (*roostv1.PushResponse, error) {
	if !filepath.IsAbs(req.GetPath()) {
		return nil, fmt.Errorf("path %q is not absolute: %w", req.GetPath(), errdefs.ErrInvalidArgument)
	}
	a, created, err := s.store.Push(req.GetPath())
	if err != nil {
		return nil, err
	}
	return &roostv1.PushResponse{Artifact: artifactProto(a), Created: created}, nil
}

func (s *artifactService) ListArtifacts(ctx context.Context, _ *roostv1.ListArtifactsRequest) (*roostv1.ListArtifactsResponse, error) {
	list, err := s.store.List()
	if err != nil {
		return nil, err
	}
	resp := &roostv1.ListArtifactsResponse{}
	for _, a := range list {
		resp.Artifacts = append(resp.Artifacts, artifactProto(a))
	}
	return resp, nil
}

type systemService struct {
	roostv1.UnimplementedSystemServiceServer
	cfg Config
}

var _ roostv1.SystemServiceServer = (*systemService)(nil)

func (s *systemService) Health(context.Context, *roostv1.HealthRequest) (*roostv1.HealthResponse, error) {
	return &roostv1.HealthResponse{Status: "serving", StartedAt: timestamppb.New(s.cfg.StartedAt), StateDir: s.cfg.StateDir}, nil
}

func (s *systemService) Version(context.Context, *roostv1.VersionRequest) (*roostv1.VersionResponse, error) {
	return &roostv1.VersionResponse{
		Version:   version.Version,
		Commit:    version.Commit,
		GoVersion: runtime.Version(),
		Schema:    s.cfg.Sessions.SchemaVersion(),
	}, nil
}

func (s *systemService) Doctor(ctx context.Context, _ *roostv1.DoctorRequest) (*roostv1.DoctorResponse, error) {
	// Probe afresh: a doctor's answer is about the host now, not at daemon start.
	host, catalog := s.cfg.Assess(ctx)
	userns, mapErr := s.userNamespaces(ctx, host)
	resp := &roostv1.DoctorResponse{Strongest: catalog.Strongest().String(), UserNamespaces: userns}
	for _, c := range catalog {
		detail := c.Detail
		if c.Class == manifest.Sealed && !c.Available && mapErr != nil {
			// The rehearsal's error is libcontainer's; this one names the cause to fix.
			detail += "; a sealed session's root is a user namespace's, and roostd cannot create one: " + mapErr.Error()
		}
		resp.Classes = append(resp.Classes, &roostv1.ClassReport{Class: c.Class.String(), Available: c.Available, Detail: detail})
	}
	checks := append(host.Checks(), containment.CheckStateDir(s.cfg.StateDir), s.checkTrees())
	if s.cfg.Sessions != nil {
		checks = append(checks, s.checkRanges())
	}
	if s.cfg.Descriptors != nil {
		checks = append(checks, checkDescriptors(s.cfg.Descriptors.Stats()))
	}
	for _, c := range checks {
		resp.Checks = append(resp.Checks, &roostv1.HostCheck{Name: c.Name, Status: c.Status, Detail: c.Detail, Hint: c.Hint})
	}
	return resp, nil
}

// checkTrees is doctor's word on the session trees: on nosuid,nodev mounts (roostd seals
// them at start), or which is not, and how to make it so.
func (s *systemService) checkTrees() containment.Check {
	trees := s.cfg.SessionTrees
	if trees == nil {
		trees = dirs.Trees(s.cfg.StateDir)
	}
	c := containment.Check{Name: "session trees nosuid,nodev"}
	if problems := dirs.CheckSealed(trees...); len(problems) > 0 {
		c.Status, c.Detail = "fail", strings.Join(problems, "; ")
		c.Hint = "what a session writes there could run setuid as its uid, or open a device, for whoever on the host runs it: restart roostd, which bind-mounts each tree over itself nosuid,nodev at start, or mount the state directory with nosuid,nodev"
		return c
	}
	c.Status = "ok"
	c.Detail = "setuid bits and device nodes are ignored in " + strings.Join(trees, ", ")
	return c
}

// checkDescriptors is doctor's word on the descriptor budget: its bounds, what each use
// holds, and how near the total it is.
func checkDescriptors(st fdbudget.Stats) containment.Check {
	var uses []string
	for _, u := range fdbudget.Uses() {
		uses = append(uses, fmt.Sprintf("%s %d", u, st.ByUse[u.String()]))
	}
	c := containment.Check{Name: "descriptors", Status: "ok",
		Detail: fmt.Sprintf("%s; %d held (%s); %d session(s) at their share", st, st.Held, strings.Join(uses, ", "), st.AtShare)}
	switch {
	case st.Total > 0 && st.Held >= st.Total:
		c.Status = "fail"
	case st.Total > 0 && st.Held*10 >= st.Total*8:
		c.Status = "warn"
	}
	if c.Status != "ok" {
		c.Hint = "sessions' connections are refused (503, X-Roost-Denied: connections) while the budget is held: raise roostd's open-file limit (LimitNOFILE; deploy/systemd/roostd.service sets 1048576) or stop sessions (roostctl ps shows them); sessions.descriptors_per_session bounds what one session may take"
	}
	return c
}

// checkRanges is doctor's word on the id ranges: how many are free, held and waiting for
// their sweep, and each quarantined one with why its sweep failed.
func (s *systemService) checkRanges() containment.Check {
	st := s.cfg.Sessions.Status()
	r := st.Ranges
	c := containment.Check{Name: "id ranges", Status: "ok",
		Detail: fmt.Sprintf("%d free, %d held, %d waiting for their sweep, %d quarantined", r["free"], r["held"], r["freed"], r["quarantined"])}
	if len(st.Quarantined) > 0 {
		c.Status = "warn"
		var which []string
		for _, q := range st.Quarantined {
			which = append(which, fmt.Sprintf("%d (last held by %s; %d tries: %s)", q.IDs.First, q.By, q.Tries, q.Error))
		}
		c.Detail += ": " + strings.Join(which, "; ")
		c.Hint = "a quarantined range is given to no session; roostd sweeps it again every minute. What its sweep could not remove is named above: end that process or remove that object, and the next sweep frees the range"
	}
	if r["free"] == 0 {
		c.Status, c.Hint = "fail", "no range is free: the next stage is refused; remove ended sessions (roostctl rm, roostctl prune) or widen sessions.ids"
	}
	return c
}

// userNamespaces reports what sealed sessions' user namespaces rest on, trying a real
// mapping of the daemon's rehearsal range; the error is that mapping's, nil when it worked.
func (s *systemService) userNamespaces(ctx context.Context, host containment.Host) (*roostv1.UserNamespaces, error) {
	pool := s.cfg.IDs
	if pool == (store.IDPool{}) {
		pool = store.IDPool{First: config.DefaultFirstID, Slots: config.DefaultIDSlots}
	}
	block := containment.IDs{First: pool.First, Size: pool.Slots * config.IDsPerSession}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	mapErr := containment.MapUserNS(ctx, containment.IDs(pool.RehearsalIDs()))
	out := &roostv1.UserNamespaces{
		Available:                host.UserNamespaces > 0,
		Max:                      int64(host.UserNamespaces),
		MappingWorks:             mapErr == nil,
		ApparmorPresent:          host.AppArmorRestrictUserNS != "",
		ApparmorRestricted:       host.AppArmorRestrictUserNS != "" && host.AppArmorRestrictUserNS != "0",
		ApparmorEnabled:          host.AppArmor,
		UnprivilegedClonePresent: host.UnprivilegedUserNSClone != "",
		UnprivilegedClone:        host.UnprivilegedUserNSClone != "" && host.UnprivilegedUserNSClone != "0",
		IdFirst:                  block.First,
		IdLast:                   block.First + block.Size - 1,
		Ranges:                   pool.Slots,
		IdsPerSession:            config.IDsPerSession,
		Conflicts:                containment.IDConflicts(block, containment.HostIDFiles()),
	}
	if mapErr != nil {
		out.Detail = mapErr.Error()
	}
	if len(out.Conflicts) > 0 {
		out.Hint = fmt.Sprintf("give sessions ids nothing else holds: set sessions.ids.first (and sessions.ids.slots) in roostd's config (--config) to a block clear of them, or move those accounts and delegations out of %d–%d", out.IdFirst, out.IdLast)
	}
	return out, mapErr
}
