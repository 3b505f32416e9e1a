package containment

import (
	"fmt"
	"strings"

	"roost.dev/roost/pkg/manifest"
)

// Where a containment requirement can come from.
const (
	SourceManifest = "capabilities.containment"
	SourceDaemon   = "roostd --containment"
	SourceRun      = "run --containment"
	SourceDefault  = "default"
)

// FloorSource is one requirement and where it came from.
type FloorSource struct {
	Source string
	Class  manifest.Class
}

// Decision is the containment a session gets.
type Decision struct {
	// Floor is the strongest class any source asked for.
	Floor   manifest.Class
	Sources []FloorSource
	// Achieved is the class the session runs under; ClassNone when the floor cannot be met.
	Achieved manifest.Class
	Met      bool
	// Shortfall says why the floor cannot be met: the class, what this host achieves, the
	// missing mechanism and the fix. Empty when it is met.
	Shortfall string
	// Mechanism is what holds a session of the achieved class.
	Mechanism string
}

// Sources lists the requirements on a session: the manifest's class (or the default when it
// names none), then the daemon's and the run's when they are set.
func Sources(p *manifest.Policy, daemon, run manifest.Class) []FloorSource {
	src := FloorSource{Source: SourceManifest, Class: p.Containment}
	if !p.ContainmentDeclared {
		src.Source = SourceDefault
	}
	out := []FloorSource{src}
	if daemon != manifest.ClassNone {
		out = append(out, FloorSource{Source: SourceDaemon, Class: daemon})
	}
	if run != manifest.ClassNone {
		out = append(out, FloorSource{Source: SourceRun, Class: run})
	}
	return out
}

// Decide takes the strongest requirement as the floor and gives the session exactly that
// class when the catalog has it: the mechanism follows what was asked, never silently less
// and never more. A floor that cannot be met is refused with the reason, never downgraded.
func Decide(p *manifest.Policy, sources []FloorSource, catalog Catalog) Decision {
	d := Decision{Sources: sources}
	var from []string
	for _, s := range sources {
		d.Floor = max(d.Floor, s.Class)
	}
	for _, s := range sources {
		if s.Class == d.Floor {
			from = append(from, s.Source)
		}
	}
	origin := strings.Join(from, ", ")

	capability := catalog.Lookup(d.Floor)
	if !capability.Available {
		d.Shortfall = fmt.Sprintf("containment floor %q (from %s) cannot be met: this build and host deliver at most %q; %s: %s",
			d.Floor, origin, catalog.Strongest(), d.Floor, capability.Detail)
		return d
	}
	d.Achieved, d.Met = d.Floor, true
	d.Mechanism = capability.Detail
	// An executable workdir keeps the class: the kernel boundary holds the session, and the
	// exec allowlist is policy inside it.
	if p.Filesystem.WorkdirExec && d.Floor >= manifest.Scoped {
		d.Mechanism += "; filesystem.workdir_exec: its workdir and scratch directories may exec, and so may memfds; everything else holds"
	}
	return d
}
