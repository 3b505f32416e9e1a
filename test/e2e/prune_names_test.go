package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// prune --dry-run names each session it would remove by id and name, with how it ended;
// the real prune prints what it removed the same way, and --json carries the names too.
func TestPruneNamesSessions(t *testing.T) {
	d := newDaemon(t)
	named := strings.TrimSpace(d.ok("run", "-d", "--name", "job-1", capsule(t, "quick", "true", "")))
	failed := strings.TrimSpace(d.ok("run", "-d", capsule(t, "broken", "exit 3", "")))
	d.ctl("wait", named)
	d.ctl("wait", failed)

	row := func(out, id string) []string {
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == id {
				return f
			}
		}
		t.Fatalf("no row for %s in:\n%s", id, out)
		return nil
	}
	check := func(what, out string) {
		t.Helper()
		if !strings.HasPrefix(out, "SESSION") || !strings.Contains(strings.Fields(strings.SplitN(out, "\n", 2)[0])[1], "NAME") {
			t.Fatalf("%s:\n%s", what, out)
		}
		if r := row(out, named); r[1] != "job-1" || r[2] != "quick@0.1.0" || !strings.Contains(strings.Join(r, " "), "ago ok") {
			t.Errorf("%s, the named session: %q", what, r)
		}
		if r := row(out, failed); r[1] != "-" || r[2] != "broken@0.1.0" || !strings.Contains(strings.Join(r, " "), "ago error") {
			t.Errorf("%s, the unnamed session: %q", what, r)
		}
	}
	check("prune --dry-run", d.ok("prune", "--dry-run"))

	var dry struct {
		Removed []struct {
			ID         string `json:"id"`
			Name       string `json:"name"`
			ExitStatus string `json:"exit_status"`
		} `json:"removed"`
	}
	if err := json.Unmarshal([]byte(d.ok("prune", "--dry-run", "--json")), &dry); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range dry.Removed {
		got[r.ID] = r.Name + " " + r.ExitStatus
	}
	if len(got) != 2 || got[named] != "job-1 ok" || got[failed] != " error" {
		t.Fatalf("prune --dry-run --json: %+v", dry)
	}

	out := d.ok("prune")
	check("prune", out)
	if !strings.Contains(out, "removed 2 ended sessions") || len(d.ps()) != 0 {
		t.Fatalf("prune:\n%s", out)
	}
}
