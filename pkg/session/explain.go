package session

import (
	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
)

func (m *Manager) explanation(p *plan) *roostv1.Explanation {
	d := p.decision
	e := &roostv1.Explanation{
		Capsule: &roostv1.CapsuleRef{Name: p.ref.Name, Version: p.ref.Version, Sha256: p.ref.SHA256, Source: p.ref.Source, Dir: p.ref.Dir},
		Containment: &roostv1.ContainmentDecision{
			Declared:        d.Floor.String(),
			Achieved:        d.Achieved.String(),
			FloorMet:        d.Met,
			ShortfallReason: d.Shortfall,
			Mechanism:       d.Mechanism,
		},
		Policy: policyProto(&p.policy),
	}
	for _, s := range d.Sources {
		e.Containment.Sources = append(e.Containment.Sources, &roostv1.FloorSource{Source: s.Source, Class: s.Class.String()})
	}
	class := d.Achieved
	if !d.Met {
		class = d.Floor
	}
	for _, g := range containment.Grants(class, &p.policy, m.planner.hostRoot(p), p.manifest.Run.Wasm != "") {
		e.Grants = append(e.Grants, &roostv1.Grant{Key: g.Key, Value: g.Value, Enforcement: g.Enforcement, Mechanism: g.Mechanism})
	}
	e.Start = m.startPath(p, class)
	e.Identity = &roostv1.Identity{Size: idsPerSession, HostRoot: m.planner.hostRoot(p)}
	if e.Identity.HostRoot {
		e.Identity.Size = 0
	}
	e.Readable = containment.Readable(class, &p.policy)
	e.Executable = containment.Executable(class, &p.policy)
	for _, sh := range p.shell {
		e.Shell = append(e.Shell, &roostv1.ShellEntry{Entry: sh.Entry, Files: sh.Files, Trees: sh.Trees})
	}
	_, verdicts := hostVariables(p.policy.Env.Allow, m.cfg.EnvPassthrough, m.cfg.HostEnv)
	for _, v := range verdicts {
		e.Env = append(e.Env, &roostv1.EnvVerdict{Name: v.name, Verdict: v.verdict, Reason: v.reason})
	}
	return e
}

func limitProto(l manifest.Limit) *roostv1.Limit {
	return &roostv1.Limit{Value: l.Value, Declared: l.Declared}
}

func policyProto(p *manifest.Policy) *roostv1.Policy {
	allow := make([]string, len(p.Network.Allow))
	for i, r := range p.Network.Allow {
		allow[i] = r.String()
	}
	r := &p.Resources
	return &roostv1.Policy{
		Containment: p.Containment.String(),
		Network:     &roostv1.NetworkPolicy{Allow: allow, UnixSockets: p.Network.UnixSockets},
		Filesystem: &roostv1.FilesystemPolicy{
			Scope: p.Filesystem.Scope, WorkdirExec: p.Filesystem.WorkdirExec, ReadOnly: p.Filesystem.ReadOnly, HostRead: p.Filesystem.HostRead,
		},
		Shell: &roostv1.ShellPolicy{Allow: p.Shell.Allow},
		Spawn: &roostv1.SpawnPolicy{
			Allow: p.Spawn.Allow, WorkdirSnapshot: p.Spawn.WorkdirSnapshot,
			MaxDepth: limitProto(p.Spawn.MaxDepth), MaxChildren: limitProto(p.Spawn.MaxChildren),
			MaxTotalChildren: limitProto(p.Spawn.MaxTotalChildren),
		},
		Env: &roostv1.EnvPolicy{Allow: p.Env.Allow},
		Limits: &roostv1.LimitsPolicy{
			DeadlineSeconds: limitProto(p.Limits.DeadlineSeconds), MemoryBytes: limitProto(p.Limits.MemoryBytes),
			WasmFuel: limitProto(p.Limits.WasmFuel),
		},
		Resources: &roostv1.ResourcesPolicy{
			CgroupMemoryBytes:      limitProto(r.CgroupMemoryBytes),
			CgroupPidsMax:          limitProto(r.CgroupPidsMax),
			CgroupCpuPercent:       limitProto(r.CgroupCPUPercent),
			MaxOpenFiles:           limitProto(r.MaxOpenFiles),
			MaxFileSizeBytes:       limitProto(r.MaxFileSizeBytes),
			CpuSeconds:             limitProto(r.CPUSeconds),
			MaxProcesses:           limitProto(r.MaxProcesses),
			MemoryBytes:            limitProto(r.MemoryBytes),
			WorkdirMaxBytes:        limitProto(r.WorkdirMaxBytes),
			WorkdirMaxInodes:       limitProto(r.WorkdirMaxInodes),
			LogMaxBytes:            limitProto(r.LogMaxBytes),
			EndpointMaxConnections: limitProto(r.EndpointMaxConnections),
			EgressMaxBytes:         limitProto(r.EgressMaxBytes),
		},
		Inference: &roostv1.InferencePolicy{
			Upstream: p.Inference.Upstream, Model: p.Inference.Model,
			MaxSessionTokens: p.Inference.MaxSessionTokens, OnExhausted: p.Inference.OnExhausted,
		},
	}
}

// IdentityProto is who a session's processes are on the host.
func IdentityProto(r *store.Record) *roostv1.Identity {
	switch {
	case r.HostRoot:
		return &roostv1.Identity{HostRoot: true}
	case r.IDs != nil:
		return &roostv1.Identity{Uid: r.IDs.First, Gid: r.IDs.First, Size: r.IDs.Size}
	}
	return nil
}

// LogStats is what roost-init counted of the session's output: logs.json, or the totals in
// exit.json when that is final and logs.json is not (a full disk at the end). Nil for a
// session that has not run, or records from before the count.
func LogStats(r *store.Record) *roostinit.LogStats {
	if r.RecordsDir == "" {
		return nil
	}
	st, err := roostinit.ReadLogStats(r.RecordsDir)
	if (err != nil || !st.Final) && r.State == store.Exited {
		if info, xerr := containment.ReadExit(r.RecordsDir); xerr == nil && info.Logs != nil {
			return info.Logs
		}
	}
	if err != nil {
		return nil
	}
	return &st
}
