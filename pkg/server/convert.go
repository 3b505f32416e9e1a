package server

// The conversion of the session record to the API's messages: what `roostctl inspect
// --json`, ps and events show.

import (
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session"
	"roost.dev/roost/pkg/session/spec"
	"roost.dev/roost/pkg/session/store"
)

// SessionProto is the session as the API (and `roostctl inspect --json`) shows it.
func SessionProto(r *store.Record) *roostv1.Session {
	s := &roostv1.Session{
		Id:   r.ID,
		Name: r.Name,
		Capsule: &roostv1.CapsuleRef{
			Name: r.Capsule.Name, Version: r.Capsule.Version, Sha256: r.Capsule.SHA256, Source: r.Capsule.Source, Dir: r.Capsule.Dir,
		},
		Identity:       session.IdentityProto(r),
		State:          string(r.State),
		ExitStatus:     string(r.ExitStatus),
		Containment:    &roostv1.ContainmentState{Declared: r.Declared, Achieved: r.Achieved},
		ParentId:       r.ParentID,
		Workdir:        r.Workdir,
		SessionWorkdir: spec.Workdir(r),
		RecordsDir:     r.RecordsDir,
		CreatedAt:      timestamp(r.CreatedAt),
		StartedAt:      timestamp(r.StartedAt),
		EndedAt:        timestamp(r.EndedAt),
		DeadlineAt:     timestamp(r.DeadlineAt),
		Spend:          &roostv1.Spend{Tokens: r.Tokens, InputTokens: r.InputTokens, OutputTokens: r.OutputTokens},
		Detail:         r.Detail,
		Command:        r.Command,
		Warm:           r.Warm,
		// What it was staged with: the cgroup's own memory.max shows only while it lives
		// (Usage), and advisory sessions' cgroups set none.
		MemoryLimitBytes: r.MemoryLimit,
		Labels:           r.Labels,
	}
	if r.ExitCode != nil {
		code := int32(*r.ExitCode)
		s.ExitCode = &code
	}
	if r.Process != nil && r.State.Live() {
		s.Pid = int32(r.Process.PID)
	}
	if r.Egress != nil {
		s.Egress = EgressProto(*r.Egress, 0)
	}
	if w := r.Wasm; w != nil {
		s.Wasm = &roostv1.WasmRun{Module: w.Module, Sha256: w.SHA256, Runtime: w.Runtime, Cache: w.Cache}
	}
	if st := session.LogStats(r); st != nil {
		s.Stdout, s.Stderr = logStatsProto(st.MaxBytes, st.Stdout), logStatsProto(st.MaxBytes, st.Stderr)
	}
	if st := session.ExecRefusals(r); st != nil {
		s.ExecRefused = &roostv1.ExecRefusals{Count: st.Count, RecentPaths: st.Recent}
	}
	s.Placement = PlacementProto(r.Placement)
	return s
}

// PlacementProto is a record's placement as the API shows it; nil for none.
func PlacementProto(p *store.Placement) *roostv1.Placement {
	if p == nil {
		return nil
	}
	out := &roostv1.Placement{Node: p.Node, Entry: p.Entry, At: timestamp(p.At), Reason: p.Reason}
	for _, c := range p.Candidates {
		out.Candidates = append(out.Candidates, &roostv1.PlacementCandidate{Node: c.Node, Running: int32(c.Running), InFlight: int32(c.InFlight),
			Max: int32(c.Max), Cpus: int32(c.CPUs), Warm: c.Warm, Score: c.Score, Drawn: c.Drawn, Refused: c.Refused})
	}
	return out
}

// placementRecord is a forwarded stage's placement as the record keeps it.
func placementRecord(p *roostv1.Placement) *store.Placement {
	out := &store.Placement{Node: p.GetNode(), Entry: p.GetEntry(), At: p.GetAt().AsTime().UTC(), Reason: p.GetReason()}
	for _, c := range p.GetCandidates() {
		out.Candidates = append(out.Candidates, store.PlacementCandidate{Node: c.GetNode(), Running: int(c.GetRunning()), InFlight: int(c.GetInFlight()),
			Max: int(c.GetMax()), CPUs: int(c.GetCpus()), Warm: c.GetWarm(), Score: c.GetScore(), Drawn: c.GetDrawn(), Refused: c.GetRefused()})
	}
	return out
}

func logStatsProto(maxBytes int64, s records.StreamStats) *roostv1.LogStats {
	return &roostv1.LogStats{WrittenBytes: s.WrittenBytes, DroppedBytes: s.DroppedBytes, MaxBytes: maxBytes, FailedBytes: s.FailedBytes}
}

// EventProto is the event as the API shows it.
func EventProto(e *store.Event) *roostv1.Event {
	ev := &roostv1.Event{
		Seq:        e.Seq,
		Time:       timestamp(e.Time),
		Type:       e.Type,
		SessionId:  e.SessionID,
		State:      string(e.State),
		ExitStatus: string(e.ExitStatus),
		Detail:     e.Detail,
	}
	if e.ExitCode != nil {
		code := int32(*e.ExitCode)
		ev.ExitCode = &code
	}
	return ev
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// EgressProto is what a session's egress proxy carried, with active connections open now.
func EgressProto(t store.EgressTotals, active int) *roostv1.Egress {
	out := &roostv1.Egress{Connections: t.Connections, Denied: t.Denied, BytesUp: t.BytesUp, BytesDown: t.BytesDown, Active: int32(active),
		UsedBytes: t.Used}
	for _, r := range t.Refused {
		out.Refused = append(out.Refused, &roostv1.EgressRefusal{Host: r.Host, Port: int32(r.Port), Reason: r.Reason, Count: r.Count,
			First: timestamp(r.First), Last: timestamp(r.Last), Detail: r.Detail, Proto: r.Proto})
	}
	return out
}

// logOptions reads a LogsRequest.
func logOptions(req *roostv1.LogsRequest) (records.LogOptions, error) {
	o := records.LogOptions{Follow: req.GetFollow(), Timestamps: req.GetTimestamps(), StdoutOffset: req.GetStdoutOffset(), StderrOffset: req.GetStderrOffset()}
	if req.Tail != nil {
		n := req.GetTail()
		if n < 0 {
			return o, fmt.Errorf("tail %d: give a number of lines, 0 or more: %w", n, errdefs.ErrInvalidArgument)
		}
		o.Tail = &n
	}
	if req.Since != nil {
		if err := req.GetSince().CheckValid(); err != nil {
			return o, fmt.Errorf("since: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		o.Since = req.GetSince().AsTime()
	}
	if o.StdoutOffset < 0 || o.StderrOffset < 0 {
		return o, fmt.Errorf("stream offsets must be 0 or more (stdout %d, stderr %d): %w", o.StdoutOffset, o.StderrOffset, errdefs.ErrInvalidArgument)
	}
	return o, nil
}

// logChunkProto is the chunk as the API sends it.
func logChunkProto(c records.LogChunk) *roostv1.LogsResponse {
	r := &roostv1.LogsResponse{Stream: c.Stream, Data: c.Data, Offset: c.Offset}
	if !c.Time.IsZero() {
		r.Time = timestamppb.New(c.Time)
	}
	return r
}
