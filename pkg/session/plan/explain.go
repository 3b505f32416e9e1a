package plan

import (
	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
)

// Explain is the plan grant by grant, as explain (and a stage hook) reads it; start says
// how a session of it would start (cold, or warm in a sandbox made ahead).
func (pl *Planner) Explain(p *Plan, start func(class manifest.Class) *roostv1.StartPath) *roostv1.Explanation {
	d := p.Decision
	e := &roostv1.Explanation{
		Capsule: &roostv1.CapsuleRef{Name: p.Ref.Name, Version: p.Ref.Version, Sha256: p.Ref.SHA256, Source: p.Ref.Source, Dir: p.Ref.Dir},
		Containment: &roostv1.ContainmentDecision{
			Declared:        d.Floor.String(),
			Achieved:        d.Achieved.String(),
			FloorMet:        d.Met,
			ShortfallReason: d.Shortfall,
			Mechanism:       d.Mechanism,
		},
		Policy: policyProto(&p.Policy),
	}
	for _, s := range d.Sources {
		e.Containment.Sources = append(e.Containment.Sources, &roostv1.FloorSource{Source: s.Source, Class: s.Class.String()})
	}
	class := d.Achieved
	if !d.Met {
		class = d.Floor
	}
	for _, g := range containment.Grants(class, &p.Policy, pl.HostRoot(p), p.Manifest.Run.Wasm != "") {
		e.Grants = append(e.Grants, &roostv1.Grant{Key: g.Key, Value: g.Value, Enforcement: g.Enforcement, Mechanism: g.Mechanism})
	}
	e.Start = start(class)
	e.System = pl.System(p, class, Command(p.Ref.Root(), p.Manifest.Run))
	e.Identity = &roostv1.Identity{Size: config.IDsPerSession, HostRoot: pl.HostRoot(p)}
	if e.Identity.HostRoot {
		e.Identity.Size = 0
	}
	e.Readable = containment.Readable(class, &p.Policy)
	e.Executable = containment.Executable(class, &p.Policy)
	for _, sh := range p.Shell {
		e.Shell = append(e.Shell, &roostv1.ShellEntry{Entry: sh.Entry, Files: sh.Files, Trees: sh.Trees, ReadTrees: sh.ReadTrees})
	}
	_, verdicts := HostVariables(p.Policy.Env.Allow, pl.cfg.EnvPassthrough, pl.cfg.HostEnv)
	for _, v := range verdicts {
		e.Env = append(e.Env, &roostv1.EnvVerdict{Name: v.Name, Verdict: v.Verdict, Reason: v.Reason})
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
			System: p.Filesystem.System,
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
