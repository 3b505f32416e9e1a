// roost-sealer starts sealed sessions' containers for roostd: libcontainer re-executes the
// binary that starts a container as that container's init, and this one is small, so a
// sealed start does not pay for roostd's size and package initialisation. roostd starts it
// and talks to it over a socket it inherits; it is not meant to be run by hand.
package main

import (
	"fmt"
	"os"

	// The cgroup manager needs the device rules code to apply a sealed session's device list.
	_ "github.com/opencontainers/cgroups/devices"
	"github.com/opencontainers/runc/libcontainer"
	// nsenter's C constructor joins the namespaces before the Go runtime starts in a
	// container's init process.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment/sealer"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init()
		os.Exit(1)
	}
	// Only roostd starts it: with its control socket as descriptor 3.
	if _, err := unix.FcntlInt(sealer.ControlFD, unix.F_GETFD, 0); err != nil {
		fmt.Fprintf(os.Stderr, "%s: roostd starts this program with its control socket; it is not run by hand\n", sealer.Name)
		os.Exit(2)
	}
	sealer.SetupLogging()
	sealer.RunFromSealedCopy()
	// Run from its sealed copy, the kernel named it after the descriptor it was executed
	// through; ps and top should say what it is.
	_ = os.WriteFile("/proc/self/comm", []byte(sealer.Name), 0)
	if err := sealer.Serve(sealer.ControlFD); err != nil {
		logrus.Error(err)
		os.Exit(1)
	}
}
