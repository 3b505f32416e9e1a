package sealed

import (
	"os"

	// The cgroup manager needs the device rules code to apply a sealed session's device list.
	_ "github.com/opencontainers/cgroups/devices"
	"github.com/opencontainers/runc/libcontainer"
	// nsenter's C constructor joins the namespaces before the Go runtime starts in a
	// container's init process.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
)

// libcontainer builds a container by re-executing the running binary as "<binary> init";
// that process must become the container's init before anything else in main runs. Any
// binary that starts sealed sessions (roostd, and the tests of packages that do) links this
// package and so passes through here.
func init() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init()
	}
}
