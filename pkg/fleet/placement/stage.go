package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// Forwarder carries a stage to another node of the fleet, as the caller (pkg/fleet/route).
type Forwarder interface {
	Stage(ctx context.Context, node, address string, req *roostv1.StageRequest) (*roostv1.StageResponse, error)
}

// Describe says what a stage request's capsule needs of its node: the class it declares at
// least, and the warm sandbox shapes that would start it. An error is the request's: the
// capsule cannot be read or is invalid, said before any node is chosen.
type Describe func(req *roostv1.StageRequest) (Need, error)

// StagerConfig is what a fleet node stages with.
type StagerConfig struct {
	Placer *Placer
	// Staged is this node's list of reservations to settle.
	Staged  *Staged
	Forward Forwarder
	Describe
	// FromNode says whether a call came from another node of the fleet, forwarding: only
	// such a call may carry a placement.
	FromNode func(ctx context.Context) bool
	// Observe, when set, is told each placement's result (pkg/metrics' PlacementResults).
	Observe func(result string)
	// Publish, when set, writes this node's sessions to the session directory now: a
	// session placed here is in it before its stage is answered, so that any node finds it
	// by the time its client has its id. Its failure is logged; the directory catches up.
	Publish func(ctx context.Context) error
	Logger  *slog.Logger
}

// Stager is a fleet node's Stage: a request placed by another node is staged here, its
// reservation settled; one pinned to this node is staged here; any other is placed, then
// staged here or forwarded to the node chosen. It remembers where it placed recent sessions, so that calls that follow a stage
// at once (run's launch) are routed before the owner's session directory entry is written.
type Stager struct {
	cfg  StagerConfig
	self string
	log  *slog.Logger

	mu     sync.Mutex
	placed map[string]placed
	order  []string
}

type placed struct{ node, address string }

// publishWithin bounds how long a placed stage waits for its session's directory entry.
const publishWithin = 2 * time.Second

// recentPlacements bounds what Placed remembers.
const recentPlacements = 4096

// NewStager checks cfg.
func NewStager(cfg StagerConfig) (*Stager, error) {
	if cfg.Placer == nil || cfg.Staged == nil || cfg.Forward == nil || cfg.Describe == nil || cfg.FromNode == nil {
		return nil, fmt.Errorf("placement: a stager needs a placer, a staged list, a forwarder, a describer and a node check: %w", errdefs.ErrInvalidArgument)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Observe == nil {
		cfg.Observe = func(string) {}
	}
	return &Stager{cfg: cfg, self: cfg.Placer.cfg.Self, log: log, placed: map[string]placed{}}, nil
}

// Stage places req and stages it: here through local, or on the node chosen.
func (s *Stager) Stage(ctx context.Context, req *roostv1.StageRequest, local func(context.Context, *roostv1.StageRequest) (*roostv1.StageResponse, error)) (*roostv1.StageResponse, error) {
	if p := req.GetPlacement(); p != nil {
		return s.stagePlaced(ctx, req, local, false)
	}
	if req.GetNode() == s.self {
		// Pinned where it is asked: nothing to choose, and no reservation to take, as for
		// a session staged on a node directly; the node's id pool is its bound.
		return local(ctx, req)
	}
	need, err := s.cfg.Describe(req)
	if err != nil {
		return nil, err
	}
	need.Node = req.GetNode()
	var d Decision
	var resp *roostv1.StageResponse
	for attempt := 1; ; attempt++ {
		d, err = s.cfg.Placer.Place(ctx, need)
		if errors.Is(err, ErrStore) && need.Node == "" && attempt == 1 {
			// Cut off from etcd, this node still serves its own: the session is staged
			// where it was asked, as a local call, and the directory learns of it later.
			s.log.Warn("placement: the fleet's etcd does not answer; staging the session here", "err", err)
			s.cfg.Observe("unplaced")
			return local(ctx, req)
		}
		if err != nil {
			s.cfg.Observe("refused")
			return nil, err
		}
		resp, err = s.stageOn(ctx, d, req, local)
		if err == nil {
			break
		}
		// Refused there, or not known to be staged: the reservation goes now, or with its
		// lease if this cannot reach etcd (a stage that did land is counted by its node).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		s.cfg.Placer.Release(rctx, &d)
		cancel()
		// A node out of room by its own count (its directory entry behind, or sessions
		// started on it directly) leaves the others; a pinned stage has no other.
		if need.Node != "" || attempt == maxAttempts || !outOfRoom(err) {
			s.cfg.Observe("refused")
			return nil, err
		}
		s.cfg.Observe("retried")
		if need.Refused == nil {
			need.Refused = map[string]string{}
		}
		need.Refused[d.Node] = err.Error()
		s.log.Info("placement: the node chosen refused the session for want of room; placing it again", "node", d.Node, "err", err)
	}
	if d.Node == s.self {
		s.cfg.Observe("here")
	} else {
		s.cfg.Observe("forwarded")
	}
	s.remember(resp.GetSession().GetId(), d.Node, d.Address)
	s.log.Info("placed a session", "session", resp.GetSession().GetId(), "node", d.Node, "reason", d.Reason)
	return resp, nil
}

// outOfRoom: the node refused the stage for want of room (its id pool, its disk), as its
// status says from afar or its error here.
func outOfRoom(err error) bool {
	return errdefs.IsResourceExhausted(err) || status.Code(err) == codes.ResourceExhausted
}

// maxAttempts bounds how many nodes one stage is tried on when each refuses it for room.
const maxAttempts = 3

// stageOn stages req on the node d chose: here, or forwarded.
func (s *Stager) stageOn(ctx context.Context, d Decision, req *roostv1.StageRequest, local func(context.Context, *roostv1.StageRequest) (*roostv1.StageResponse, error)) (*roostv1.StageResponse, error) {
	fwd := proto.CloneOf(req)
	fwd.Node = d.Node
	fwd.Placement = decisionProto(d)
	if d.Node == s.self {
		return s.stagePlaced(ctx, fwd, local, true)
	}
	resp, err := s.cfg.Forward.Stage(ctx, d.Node, d.Address, fwd)
	if err != nil {
		return nil, fmt.Errorf("placed on node %s (%s): %w", d.Node, d.Reason, err)
	}
	return resp, nil
}

// stagePlaced stages here a request carrying its placement (made here when ours), and lists
// its reservation for this node's directory entry to settle.
func (s *Stager) stagePlaced(ctx context.Context, req *roostv1.StageRequest, local func(context.Context, *roostv1.StageRequest) (*roostv1.StageResponse, error), ours bool) (*roostv1.StageResponse, error) {
	p := req.GetPlacement()
	// Otherwise checked as one from another node would be, whatever entry it names.
	if !ours && !s.cfg.FromNode(ctx) {
		return nil, fmt.Errorf("placement: only a node of the fleet forwarding a stage may say how it was placed: %w", errdefs.ErrPermissionDenied)
	}
	if p.GetNode() != s.self || req.GetNode() != s.self {
		return nil, fmt.Errorf("placement: a stage placed on node %q reached node %q: %w", p.GetNode(), s.self, errdefs.ErrInvalidArgument)
	}
	if err := s.cfg.Staged.Check(p.GetReservation()); err != nil {
		return nil, err
	}
	resp, err := local(ctx, req)
	if err != nil {
		return nil, err
	}
	s.cfg.Staged.Add(p.GetReservation())
	if s.cfg.Publish != nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishWithin)
		if err := s.cfg.Publish(pctx); err != nil {
			s.log.Warn("placement: a session placed here is not in the session directory yet; it is once etcd takes it", "session", resp.GetSession().GetId(), "err", err)
		}
		cancel()
	}
	return resp, nil
}

func (s *Stager) remember(id, node, address string) {
	if id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.placed[id]; !ok {
		s.order = append(s.order, id)
	}
	s.placed[id] = placed{node, address}
	if len(s.order) > recentPlacements {
		delete(s.placed, s.order[0])
		s.order = s.order[1:]
	}
}

// Placed is the node a session this node placed lately went to.
func (s *Stager) Placed(id string) (node, address string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.placed[id]
	return p.node, p.address, ok
}

func decisionProto(d Decision) *roostv1.Placement {
	out := &roostv1.Placement{Node: d.Node, Entry: d.Entry, At: timestamppb.New(d.At), Reason: d.Reason, Reservation: d.Reservation}
	for _, c := range d.Candidates {
		out.Candidates = append(out.Candidates, &roostv1.PlacementCandidate{Node: c.Node, Running: int32(c.Running), InFlight: int32(c.InFlight),
			Max: int32(c.Max), Cpus: int32(c.CPUs), Warm: c.Warm, Score: c.Score, Drawn: c.Drawn, Refused: c.Refused})
	}
	return out
}
