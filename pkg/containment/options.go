package containment

import (
	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/sealer"
)

// Option configures a runtime at construction.
type Option func(*Options)

// Options are what a runtime was given: ApplyOptions makes them of its Options.
type Options struct {
	// Cgroups says where sessions' cgroups go; nil is cgroups.Default().
	Cgroups *cgroups.Sessions
	// Sealer, for the sealed runtime, starts its containers; nil: the runtime's own
	// process does.
	Sealer *sealer.Client
	// NoMemfdSysctl has a scoped or sealed runtime leave vm.memfd_noexec alone where the
	// kernel has it, and hold memfds with seccomp as where it has not (WithoutMemfdSysctl).
	NoMemfdSysctl bool
}

// WithSealer has a sealed runtime start its containers through roost-sealer (see package
// sealer) rather than from this process.
func WithSealer(c *sealer.Client) Option { return func(o *Options) { o.Sealer = c } }

// WithCgroups makes a runtime put its sessions' cgroups where c says. Without it a runtime
// uses the default configuration, resolved once per process.
func WithCgroups(c *cgroups.Sessions) Option { return func(o *Options) { o.Cgroups = c } }

// ApplyOptions is what opts say, in order: a later one overrides an earlier.
func ApplyOptions(opts []Option) Options {
	var o Options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}
