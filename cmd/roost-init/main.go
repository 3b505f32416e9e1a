// roost-init is the supervisor every session runs under, and the roost-exec stage that
// starts its program. roostd starts it; it is not meant to be run by hand. It is a binary
// of its own, static and small, because it starts twice on every launch and (for sealed
// sessions) runs inside the session's root.
package main

import (
	"fmt"
	"os"

	"roost.dev/roost/pkg/containment/roostinit"
)

func main() {
	if roostinit.Run(os.Args) {
		return
	}
	fmt.Fprintf(os.Stderr, "roost-init: started as %q; roostd starts this program as %s or %s, it is not run by hand\n",
		os.Args[0], roostinit.InitName, roostinit.ExecName)
	os.Exit(2)
}
