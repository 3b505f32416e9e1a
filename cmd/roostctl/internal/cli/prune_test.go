package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func pruneAnswer() (*roostv1.PruneResponse, map[string]string) {
	ended := timestamppb.New(time.Now().Add(-90 * time.Minute))
	capsule := &roostv1.CapsuleRef{Name: "quick", Version: "0.1.0"}
	return &roostv1.PruneResponse{
		Removed: []*roostv1.PrunedSession{
			{Id: "ses_aaa", Capsule: capsule, EndedAt: ended, ExitStatus: "ok", Bytes: 2048},
			{Id: "ses_bbb", Capsule: capsule, EndedAt: ended, ExitStatus: "error", Bytes: 1},
		},
		Kept:   []*roostv1.PrunedSession{{Id: "ses_ccc", Capsule: capsule, EndedAt: ended, ExitStatus: "ok", KeptBecause: "a live session descends from it"}},
		Bytes:  2049,
		DryRun: true,
	}, map[string]string{"ses_aaa": "build-1", "ses_ccc": "parent"}
}

// The table names each session by id and name, with when it ended and how.
func TestPrunedTable(t *testing.T) {
	resp, names := pruneAnswer()
	var out bytes.Buffer
	printPruned(&out, resp.GetRemoved(), names)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := [][]string{
		{"SESSION", "NAME", "CAPSULE", "ENDED", "STATUS", "SIZE"},
		{"ses_aaa", "build-1", "quick@0.1.0", "1h", "ago", "ok", "2.0", "KiB"},
		{"ses_bbb", "-", "quick@0.1.0", "1h", "ago", "error", "1", "B"},
	}
	if len(lines) != len(want) {
		t.Fatalf("table:\n%s", out.String())
	}
	for i, line := range lines {
		if got := strings.Fields(line); strings.Join(got, " ") != strings.Join(want[i], " ") {
			t.Errorf("line %d: %q; want %q", i, got, want[i])
		}
	}
}

// --json is the proto's answer in its field order, with each session's name after its id.
func TestPruneJSONNames(t *testing.T) {
	resp, names := pruneAnswer()
	var out bytes.Buffer
	if err := printPruneJSON(&out, resp, names); err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	for line := range strings.Lines(out.String()) {
		compact.WriteString(strings.TrimSpace(line))
	}
	got := strings.ReplaceAll(compact.String(), `": `, `":`)
	for _, want := range []string{
		`{"removed":[{"id":"ses_aaa","name":"build-1","capsule":{"name":"quick"`,
		`"exit_status":"ok","bytes":"2048","kept_because":""},{"id":"ses_bbb","name":"","capsule"`,
		`"kept":[{"id":"ses_ccc","name":"parent","capsule"`,
		`"kept_because":"a live session descends from it"}],"bytes":"2049","events_compacted":"0","dry_run":true}`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("prune --json lacks %s:\n%s", want, out.String())
		}
	}
}
