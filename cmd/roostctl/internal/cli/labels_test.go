package cli

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// --label takes KEY=VALUE and KEY (empty), repeatable, once per key; the request carries
// them as given, for roostd to judge.
func TestLabelFlag(t *testing.T) {
	var f stageFlags
	cmd := &cobra.Command{Use: "stage"}
	f.register(cmd)
	if err := cmd.ParseFlags([]string{"-l", "team=a", "--label", "tier", "-l", "a b=c=d"}); err != nil {
		t.Fatal(err)
	}
	req, err := f.request(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := labelPairs(req.GetLabels()), []string{"a b=c=d", "team=a", "tier="}; !slices.Equal(got, want) {
		t.Errorf("labels %q, want %q", got, want)
	}
	err = cmd.ParseFlags([]string{"-l", "team=b"})
	if err == nil || !strings.Contains(err.Error(), `label "team" given twice`) {
		t.Errorf("a key given twice: %v", err)
	}
}

// ps --filter label=... goes to roostd as ListRequest.label; every other key still filters
// here.
func TestFilterLabel(t *testing.T) {
	f, err := parsePSFilters([]string{"label=team=a,label=tier", "state=running"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.labels, []string{"team=a", "tier"}) {
		t.Errorf("label selectors %q", f.labels)
	}
	if _, err := parsePSFilters([]string{"label="}); err == nil || !isUsage(err) {
		t.Errorf("label=: %v, want a usage error", err)
	}
}

// events matches a session's labels as roostd's List does.
func TestLabelSelected(t *testing.T) {
	labels := map[string]string{"team": "a", "tier": ""}
	for _, c := range []struct {
		sels []string
		want bool
	}{
		{nil, true}, {[]string{"team=a"}, true}, {[]string{"team=b"}, false}, {[]string{"team"}, true},
		{[]string{"tier="}, true}, {[]string{"team="}, false}, {[]string{"owner"}, false},
		{[]string{"team=a", "tier"}, true}, {[]string{"team=a", "owner"}, false},
	} {
		if got := labelSelected(labels, c.sels); got != c.want {
			t.Errorf("%q: %v, want %v", c.sels, got, c.want)
		}
	}
}

// inspect lists the labels in key order, one a line; a template reaches one with index,
// empty where it is not set.
func TestLabelsShown(t *testing.T) {
	s := &roostv1.Session{Id: "ses_x", Labels: map[string]string{"tier": "", "team": "a", "example.com/run": "r-1"}}
	var b strings.Builder
	printSession(&b, s)
	if want := "labels:       example.com/run=r-1\n              team=a\n              tier=\n"; !strings.Contains(b.String(), want) {
		t.Errorf("no %q in:\n%s", want, b.String())
	}
	tmpl, err := sessionTemplate(`{{index .labels "team"}}|{{index .labels "owner"}}|{{.labels}}`)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	bare := &roostv1.Session{Id: "ses_y"}
	if err := executeTemplate(&out, tmpl, []*roostv1.Session{s, bare}, nil); err != nil {
		t.Fatal(err)
	}
	if want := "a||map[example.com/run:r-1 team:a tier:]\n||map[]\n"; out.String() != want {
		t.Errorf("template printed %q, want %q", out.String(), want)
	}
}
