package e2e

import (
	"slices"
	"strings"
	"testing"
)

// completions asks roostctl's hidden __complete command, as a shell's completion script
// does, what it offers for line (the word being completed last, "" for a new word): the
// words alone, without descriptions or the directive.
func (d *daemon) completions(line ...string) []string {
	d.t.Helper()
	out := d.ok(append([]string{"__complete"}, line...)...)
	var words []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, ":") {
			break // the directive ends the list
		}
		word, _, _ := strings.Cut(l, "\t")
		words = append(words, word)
	}
	slices.Sort(words)
	return words
}

// Completing a SESSION offers, by name and by id, only the sessions the verb can act on.
func TestCompletionOffersWhatAVerbTakes(t *testing.T) {
	d := newDaemon(t)
	sleeper := capsule(t, "sleeper", "sleep 300", "capabilities:\n  containment: scoped\n  shell:\n    allow: [sleep]\n")
	staged := strings.TrimSpace(d.ok("stage", "--name", "st", sleeper))
	running := strings.TrimSpace(d.ok("run", "-d", "--name", "up", sleeper))
	paused := strings.TrimSpace(d.ok("run", "-d", "--name", "frozen", sleeper))
	d.ok("pause", paused)
	exited := strings.TrimSpace(d.ok("run", "-d", "--name", "done", capsule(t, "quick", "true", "")))
	d.ctl("wait", exited)

	names := map[string]string{staged: "st", running: "up", paused: "frozen", exited: "done"}
	// words is what completion offers for sessions: each one's name and id.
	words := func(ids ...string) []string {
		var out []string
		for _, id := range ids {
			out = append(out, id, names[id])
		}
		slices.Sort(out)
		return out
	}
	every := words(staged, running, paused, exited)
	for _, tc := range []struct {
		line []string
		want []string
	}{
		{[]string{"launch", ""}, words(staged)},
		{[]string{"stop", ""}, words(running, paused)},
		{[]string{"kill", ""}, words(running, paused)},
		{[]string{"pause", ""}, words(running)},
		{[]string{"resume", ""}, words(paused)},
		// exec's own subcommands (its detached execs') come with the running sessions.
		{[]string{"exec", ""}, slices.Sorted(slices.Values(append(words(running), "attach", "kill", "ls", "wait")))},
		{[]string{"rm", ""}, words(staged, exited)},
		{[]string{"rm", "-f", ""}, every},
		{[]string{"rm", "--force", "st", ""}, words(running, paused, exited)},
		{[]string{"logs", ""}, every},
		{[]string{"inspect", ""}, every},
		{[]string{"wait", ""}, every},
		{[]string{"stats", "--no-stream", ""}, every},
		// What has been typed narrows it, by name or id.
		{[]string{"logs", "d"}, []string{"done"}},
		{[]string{"inspect", running[:len(running)-2]}, []string{running}},
		// A verb of one SESSION takes no second.
		{[]string{"inspect", "up", ""}, nil},
	} {
		if got := d.completions(tc.line...); !slices.Equal(got, tc.want) {
			t.Errorf("roostctl %s<TAB> offers %v; want %v", strings.Join(tc.line, " "), got, tc.want)
		}
	}
}
