package e2e

import (
	"strings"
	"testing"
)

// run of a parent returns once its whole tree has ended, with the parent's exit code, so rm
// right after never finds a child still stopping. The child traps SIGTERM and takes a
// second to end after its parent's end stops it: before run waited for the subtree, rm met
// it "stopping" every time.
func TestRunParentWaitsForTree(t *testing.T) {
	d := newDaemon(t)
	d.push(capsule(t, "trapper", `trap 'sleep 1; exit 0' TERM
echo up > /work/up
while :; do sleep 0.1; done`, sealedCaps("sleep", "", 120)))
	parent := capsule(t, "parent", apiShell+`
api -d '{"capsule":"trapper","version":"0.1.0"}' "$ROOST_ENDPOINT/v1/spawn" >/dev/null
until [ -e /work/.roost/children/trapper-*/up ]; do sleep 0.05; done
echo "$ROOST_SESSION_ID"
exit 3`, sealedCaps("curl, sleep", "trapper", 120))
	for i := range 50 {
		res := d.ctl("run", parent)
		id := strings.TrimSpace(res.stdout)
		if res.code != 3 || !strings.HasPrefix(id, "ses_") {
			t.Fatalf("run %d: want the parent's exit 3 and its id: %+v\nroostd: %s", i, res, d.log)
		}
		kids := d.byCapsule("trapper")
		if len(kids) != 1 {
			t.Fatalf("run %d: %d children: %+v", i, len(kids), kids)
		}
		// Exit 0 is the trap's: the child outlived its parent's end by its second.
		if c := kids[0]; c.State != "exited" || c.ExitCode == nil || *c.ExitCode != 0 || !strings.Contains(c.Detail, "its parent "+id+" ended") {
			t.Fatalf("run %d: when run returned, the child was %s, exit %v, %q", i, c.State, c.ExitCode, c.Detail)
		}
		if res := d.ctl("rm", id); res.code != 0 {
			t.Fatalf("run %d: rm right after run: %+v", i, res)
		}
		if left := d.ps(); len(left) != 0 {
			t.Fatalf("run %d: after rm: %+v", i, left)
		}
	}
}
