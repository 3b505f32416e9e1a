package cli

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func TestShortIDsLengthenOnCollision(t *testing.T) {
	list := []*roostv1.Session{
		{Id: "ses_0190000000017000" + "8888" + "aaaabbbbcccc"},
		{Id: "ses_0190000000027000" + "8881" + "aaaabbbbcccc"},
		{Id: "ses_0190000000037000" + "8882" + "aaaabbbbcccc"},
		{Id: "ses_0190000000047000" + "8888" + "000011112222"},
		{Id: "ses_short"},
	}
	got := shortIDs(list)
	want := map[string]string{
		list[0].Id: "8aaaabbbbcccc", list[1].Id: "1aaaabbbbcccc", list[2].Id: "2aaaabbbbcccc",
		list[3].Id: "000011112222", "ses_short": "ses_short",
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("short id of %s: %q, want %q", id, got[id], w)
		}
	}
}

func at(sec int64) *timestamppb.Timestamp { return timestamppb.New(time.Unix(sec, 0)) }

// --tree: the top-level sessions newest first, each one's children under it in the order
// they were spawned.
func TestTreeRootsNewestFirst(t *testing.T) {
	list := []*roostv1.Session{ // as roostd lists them: oldest first
		{Id: "ses_a", CreatedAt: at(1)},
		{Id: "ses_a1", ParentId: "ses_a", CreatedAt: at(2)},
		{Id: "ses_b", CreatedAt: at(3)},
		{Id: "ses_a2", ParentId: "ses_a", CreatedAt: at(4)},
		{Id: "ses_b1", ParentId: "ses_b", CreatedAt: at(5)},
		{Id: "ses_orphan", ParentId: "ses_gone", CreatedAt: at(6)},
	}
	rows, prefixes := asTree(list)
	var got []string
	for i, r := range rows {
		got = append(got, prefixes[i]+r.Id)
	}
	want := []string{"ses_orphan", "ses_b", "└─ ses_b1", "ses_a", "├─ ses_a1", "└─ ses_a2"}
	if !slices.Equal(got, want) {
		t.Fatalf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestWriteTableNoTrailingSpaces(t *testing.T) {
	var buf bytes.Buffer
	writeTable(&buf, [][]string{{"ID", "NAME", "DETAIL"}, {"└─ abc", "-", ""}, {"abcdef", "web", "why"}})
	want := "ID      NAME  DETAIL\n└─ abc  -\nabcdef  web   why\n"
	if buf.String() != want {
		t.Fatalf("table:\n%q\nwant:\n%q", buf.String(), want)
	}
}

func TestEventRowFixedWidths(t *testing.T) {
	var buf bytes.Buffer
	code := int32(3)
	printEventRow(&buf, []string{"SEQ", "TIME", "TYPE", "SESSION", "DETAIL"}, eventWidths)
	for _, ev := range []*roostv1.Event{
		{Seq: 7, Time: at(0), Type: "session.staged", SessionId: "ses_0190000000017000888800001111aaaa"},
		{Seq: 12345, Time: at(0), Type: "session.exited", SessionId: "ses_0190000000017000888800001111aaaa", ExitStatus: "error", ExitCode: &code},
		{Seq: 12346, Time: at(0), Type: "hook.ran", Detail: "policy: allowed"},
	} {
		printEventRow(&buf, eventRow(ev, false), eventWidths)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	typeAt := strings.Index(lines[0], "TYPE")
	for _, l := range lines {
		if strings.HasSuffix(l, " ") || l[typeAt-1] != ' ' || l[typeAt] == ' ' {
			t.Fatalf("not aligned, or trailing spaces:\n%s", buf.String())
		}
	}
	if !strings.HasSuffix(lines[1], "session.staged     00001111aaaa") {
		t.Errorf("an event without detail: %q", lines[1])
	}
	if !strings.HasSuffix(lines[2], "00001111aaaa  error (3)") || !strings.Contains(lines[3], "  -             policy: allowed") {
		t.Errorf("events:\n%s", buf.String())
	}
}

func TestParseUntil(t *testing.T) {
	now := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2025-03-04T05:00:00Z":      time.Date(2025, 3, 4, 5, 0, 0, 0, time.UTC),
		"2025-03-04T05:00:00+01:00": time.Date(2025, 3, 4, 4, 0, 0, 0, time.UTC),
		"1741064400":                time.Unix(1741064400, 0),
		"10m":                       now.Add(-10 * time.Minute),
		"-30s":                      now.Add(30 * time.Second),
	} {
		got, err := parseUntil(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseUntil(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "yesterday", "10 minutes", "2025-13-01"} {
		if _, err := parseUntil(in, now); err == nil || !isUsage(err) {
			t.Errorf("parseUntil(%q): %v", in, err)
		}
	}
}
