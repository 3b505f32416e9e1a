package sealed_test

import (
	"os"
	"testing"

	"roost.dev/roost/pkg/containment/internal/testkit"
)

// kit is this test binary's; its sessions' ids start at 0x68000000, apart from roostd's
// default block and from the other containment packages' tests.
var kit = &testkit.Kit{FirstID: 0x68000000}

// The test binary plays roost-init and roost-exec (kit.Main), as roostd's binary does.
func TestMain(m *testing.M) { os.Exit(kit.Main(m)) }
