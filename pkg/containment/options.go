package containment

import (
	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/sealer"
)

// Option configures a runtime at construction.
type Option func(*options)

type options struct {
	cgroups *cgroups.Sessions
	sealer  *sealer.Client
}

// WithSealer has a sealed runtime start its containers through roost-sealer (see package
// sealer) rather than from this process.
func WithSealer(c *sealer.Client) Option { return func(o *options) { o.sealer = c } }

// WithCgroups makes a runtime put its sessions' cgroups where c says. Without it a runtime
// uses the default configuration, resolved once per process.
func WithCgroups(c *cgroups.Sessions) Option { return func(o *options) { o.cgroups = c } }

func applyOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}
