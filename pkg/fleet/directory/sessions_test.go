package directory_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/directory"
)

// localSessions stands for a node's session manager: what List returns, changed by the test.
type localSessions struct {
	mu   sync.Mutex
	byID map[string]directory.Session
}

func newLocal(ss ...directory.Session) *localSessions {
	l := &localSessions{byID: map[string]directory.Session{}}
	l.set(ss...)
	return l
}

func (l *localSessions) set(ss ...directory.Session) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range ss {
		l.byID[s.ID] = s
	}
}

func (l *localSessions) remove(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		delete(l.byID, id)
	}
}

func (l *localSessions) list() ([]directory.Session, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Collect(maps.Values(l.byID)), nil
}

var epoch = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// session i of a node, as its manager says it: the publisher fills in Schema and Node.
func session(node string, i int, state string) directory.Session {
	return directory.Session{ID: fmt.Sprintf("ses_%s%06d", strings.ReplaceAll(node, "-", ""), i), Name: fmt.Sprintf("s%d", i), State: state,
		Capsule: "hello@0.1.0", Class: "advisory", CreatedAt: epoch.Add(time.Duration(i) * time.Second)}
}

func publish(t *testing.T, st fleet.Store, node string, l *localSessions) *directory.Publisher {
	t.Helper()
	p, err := directory.PublishSessions(directory.SessionsConfig{Store: st, Node: node, List: l.list, Interval: 50 * time.Millisecond, Timeout: time.Second,
		Resync: 300 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Stop(ctx)
	})
	return p
}

func stop(t *testing.T, p *directory.Publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func sessions(t *testing.T, st fleet.Store) map[string]directory.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := directory.ListSessions(ctx, st, "")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]directory.Session{}
	for _, s := range list {
		out[s.ID] = s
	}
	return out
}

func waitSessions(t *testing.T, st fleet.Store, what string, ok func(map[string]directory.Session) bool) map[string]directory.Session {
	t.Helper()
	deadline := time.Now().Add(giveUp)
	for {
		got := sessions(t, st)
		if ok(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never seen; the directory holds %d sessions", what, len(got))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitRounds waits until p has completed n rounds in all.
func waitRounds(t *testing.T, p *directory.Publisher, n int64) directory.PublisherStats {
	t.Helper()
	deadline := time.Now().Add(giveUp)
	for {
		st := p.Stats()
		if st.Rounds >= n {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the publisher never completed %d rounds: %+v", n, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sameAs: every session of l is in the directory, of node, saying what l says.
func sameAs(node string, l *localSessions) func(map[string]directory.Session) bool {
	return func(m map[string]directory.Session) bool {
		local, _ := l.list()
		n := 0
		for _, s := range m {
			if s.Node == node {
				n++
			}
		}
		if n != len(local) {
			return false
		}
		for _, s := range local {
			got, ok := m[s.ID]
			if !ok || got.State != s.State || got.Name != s.Name || !got.EndedAt.Equal(s.EndedAt) || got.Node != node {
				return false
			}
		}
		return true
	}
}

// A node's 200 sessions published in a few Txns; a state change and a removal published;
// nothing written while nothing changes; a publisher restarted after sessions were removed
// while it was down deletes their entries and rewrites none of the others; a publisher cut
// from etcd keeps what it could not write and writes it once healed.
func TestPublisherOnEtcd(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	observer := open(t, c.Endpoints())
	link := c.Link()
	st := open(t, link.Endpoints())
	l := newLocal()
	for i := range 200 {
		l.set(session("node-a", i, "running"))
	}
	before := revision(t, observer)
	p := publish(t, st, "node-a", l)
	got := waitSessions(t, observer, "200 sessions published", sameAs("node-a", l))
	stats := waitRounds(t, p, 1)
	t.Logf("200 sessions: %+v, %d revisions", stats, revision(t, observer)-before)
	if stats.Puts != 200 || stats.Txns < 4 || stats.Txns > 8 || revision(t, observer)-before > 8 {
		t.Errorf("200 sessions written as %+v over %d revisions; want 200 puts in 4 Txns of 64 (a few more at most)", stats, revision(t, observer)-before)
	}
	s7 := got[session("node-a", 7, "").ID]
	if s7.Schema != directory.Schema || s7.Capsule != "hello@0.1.0" || s7.Class != "advisory" || !s7.CreatedAt.Equal(epoch.Add(7*time.Second)) ||
		s7.UpdatedAt.IsZero() || !s7.EndedAt.IsZero() || s7.LastState != "" {
		t.Errorf("session 7 as read back: %+v", s7)
	}

	top := t
	t.Run("ChangeAndRemove", func(t *testing.T) {
		ended := session("node-a", 3, "exited")
		ended.EndedAt = epoch.Add(time.Hour)
		l.set(ended)
		l.remove(session("node-a", 4, "").ID)
		before := p.Stats()
		p.Nudge()
		waitSessions(t, observer, "the end of 3 and the removal of 4", sameAs("node-a", l))
		after := p.Stats()
		if after.Puts-before.Puts != 1 || after.Deletes-before.Deletes != 1 {
			t.Errorf("one change and one removal written as %d puts and %d deletes", after.Puts-before.Puts, after.Deletes-before.Deletes)
		}
		// Nudged with nothing changed: nothing written.
		quiet := revision(t, observer)
		n := p.Stats().Rounds
		p.Nudge()
		waitRounds(t, p, n+1)
		if d := revision(t, observer) - quiet; d != 0 {
			t.Errorf("%d writes while nothing changed", d)
		}
	})

	t.Run("Restarted", func(t *testing.T) {
		stop(t, p)
		// Removed while the node's roostd was down.
		l.remove(session("node-a", 10, "").ID, session("node-a", 11, "").ID, session("node-a", 12, "").ID)
		before := revision(t, observer)
		// Under the whole test's t: it publishes on after this part.
		p = publish(top, st, "node-a", l)
		stats := waitRounds(t, p, 1)
		if stats.Puts != 0 || stats.Deletes != 3 || stats.Txns != 1 {
			t.Errorf("a restarted publisher: %+v; want 3 deletes in one Txn and no put", stats)
		}
		if d := revision(t, observer) - before; d != 1 {
			t.Errorf("a restarted publisher made %d revisions; want 1 (the deletes)", d)
		}
		if !sameAs("node-a", l)(sessions(t, observer)) {
			t.Error("after the restart the directory is not as the node's sessions are")
		}
	})

	t.Run("CutOffCatchesUp", func(t *testing.T) {
		link.Blackhole()
		for i := 20; i < 30; i++ {
			s := session("node-a", i, "exited")
			s.EndedAt = epoch.Add(2 * time.Hour)
			l.set(s)
		}
		l.set(session("node-a", 500, "staged"), session("node-a", 501, "staged"))
		l.remove(session("node-a", 40, "").ID)
		failed := p.Stats().Failed
		p.Nudge()
		deadline := time.Now().Add(giveUp)
		for p.Stats().Failed == failed {
			if time.Now().After(deadline) {
				t.Fatalf("no round failed while cut off: %+v", p.Stats())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got := sessions(t, observer); got[session("node-a", 20, "").ID].State != "running" || len(got) != 196 {
			t.Fatalf("while cut off, the directory changed: %d sessions, session 20 %+v", len(got), got[session("node-a", 20, "").ID])
		}
		link.Heal()
		// No nudge: the pending diff is the publisher's to write.
		waitSessions(t, observer, "the changes made while cut off", sameAs("node-a", l))
	})
}

// Two nodes claiming one session id: the entry is the first writer's, and the other node's
// publisher neither overwrites nor deletes it, whether it read the entry at its start or
// met it in a Txn it wrote on a reading from before it was there.
func TestPublisherNeverWritesAnotherNodesEntry(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	observer := open(t, c.Endpoints())
	shared := directory.Session{ID: "ses_shared", Name: "shared", State: "running", Capsule: "hello@0.1.0", CreatedAt: epoch}

	// b starts first, so that its reading of the directory is from before a's write.
	lb := newLocal(session("node-b", 1, "running"))
	pb := publish(t, open(t, c.Endpoints()), "node-b", lb)
	waitRounds(t, pb, 1)

	la := newLocal(shared)
	pa := publish(t, open(t, c.Endpoints()), "node-a", la)
	waitRounds(t, pa, 1)
	first := sessions(t, observer)["ses_shared"]
	if first.Node != "node-a" {
		t.Fatalf("ses_shared is %+v; want node-a's", first)
	}

	// b now says it has the same id, in another state.
	claim := shared
	claim.State = "exited"
	lb.set(claim, session("node-b", 2, "running"))
	conflicts := pb.Stats().Conflicts
	n := pb.Stats().Rounds
	pb.Nudge()
	stats := waitRounds(t, pb, n+1)
	if stats.Conflicts == conflicts {
		t.Errorf("node-b's put on a stale reading was not refused by its compare: %+v", stats)
	}
	got := sessions(t, observer)
	if s := got["ses_shared"]; s.Node != "node-a" || s.State != "running" || !s.UpdatedAt.Equal(first.UpdatedAt) {
		t.Errorf("node-a's entry, after node-b claimed its id: %+v", s)
	}
	if _, ok := got[session("node-b", 2, "").ID]; !ok {
		t.Error("node-b's own new session was not written beside the one it was refused")
	}

	// b restarts: it reads a's entry as a's, and leaves it alone; and b dropping the id
	// deletes nothing of a's.
	stop(t, pb)
	pb = publish(t, open(t, c.Endpoints()), "node-b", lb)
	waitRounds(t, pb, 1)
	lb.remove("ses_shared")
	n = pb.Stats().Rounds
	pb.Nudge()
	waitRounds(t, pb, n+1)
	if s, ok := sessions(t, observer)["ses_shared"]; !ok || s.Node != "node-a" || !s.UpdatedAt.Equal(first.UpdatedAt) {
		t.Errorf("node-a's entry, after node-b restarted and dropped the id: %+v (present %t)", s, ok)
	}
	if st := pb.Stats(); st.Puts != 0 || st.Deletes != 0 {
		t.Errorf("node-b, restarted with nothing changed of its own, wrote %+v", st)
	}
}

// MarkLost marks every entry of one node, keeping its state; marking again marks none; a
// node that comes back writes its states over the mark.
func TestMarkLost(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, c.Endpoints())
	lc := newLocal()
	for i := range 130 {
		lc.set(session("node-c", i, "running"))
	}
	ended := session("node-c", 130, "exited")
	ended.EndedAt = epoch.Add(time.Hour)
	lc.set(ended)
	ld := newLocal(session("node-d", 1, "running"))
	pc := publish(t, st, "node-c", lc)
	pd := publish(t, st, "node-d", ld)
	waitSessions(t, st, "both nodes' sessions", func(m map[string]directory.Session) bool { return len(m) == 132 })
	stop(t, pc)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := directory.MarkLost(ctx, st, "", "node-c")
	if err != nil || n != 131 {
		t.Fatalf("MarkLost node-c: %d, %v; want 131", n, err)
	}
	got := sessions(t, st)
	for id, s := range got {
		switch {
		case s.Node == "node-d" && (s.State != "running" || s.LastState != ""):
			t.Errorf("node-d's %s was marked: %+v", id, s)
		case s.Node == "node-c" && s.State != directory.StateLost:
			t.Errorf("node-c's %s is %s after MarkLost", id, s.State)
		}
	}
	if s := got[ended.ID]; s.LastState != "exited" || !s.EndedAt.Equal(ended.EndedAt) {
		t.Errorf("an ended session marked lost: %+v; want its last state exited and its end kept", s)
	}
	if s := got[session("node-c", 0, "").ID]; s.LastState != "running" {
		t.Errorf("a running session marked lost: %+v", s)
	}
	if n, err := directory.MarkLost(ctx, st, "", "node-c"); err != nil || n != 0 {
		t.Errorf("MarkLost again: %d, %v; want 0", n, err)
	}
	if _, err := directory.MarkLost(ctx, st, "", "a/b"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("MarkLost of a bad node name: %v", err)
	}

	// node-d is marked lost while it runs: it reads its entries again at its next resync
	// and writes its sessions' state over the mark, with no event of its own.
	if n, err := directory.MarkLost(ctx, st, "", "node-d"); err != nil || n != 1 {
		t.Fatalf("MarkLost node-d: %d, %v", n, err)
	}
	waitSessions(t, st, "node-d's running session written over its mark", sameAs("node-d", ld))
	if stats := pd.Stats(); stats.Puts != 2 {
		t.Errorf("node-d's publisher: %+v; want its one session put twice (published, then over the mark)", stats)
	}

	// node-c was not gone for good after all.
	pc = publish(t, st, "node-c", lc)
	waitSessions(t, st, "node-c's states written over the marks", sameAs("node-c", lc))
	if s := sessions(t, st)[session("node-c", 5, "").ID]; s.LastState != "" {
		t.Errorf("a session written again keeps its mark: %+v", s)
	}
	_ = pc
}

// LocateSession by id (one key), by name (unique, or on several nodes), absent; a lost
// session is found; ListSessions orders by node, creation, id.
func TestLocateSession(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, c.Endpoints())
	la := newLocal(session("node-a", 1, "running"), session("node-a", 2, "running"), session("node-a", 0, "running"))
	twin := session("node-b", 1, "staged") // named s1, as node-a's session 1
	lb := newLocal(twin, session("node-b", 9, "running"))
	publish(t, st, "node-a", la)
	publish(t, st, "node-b", lb)
	waitSessions(t, st, "both nodes' sessions", func(m map[string]directory.Session) bool { return len(m) == 5 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	s, err := directory.LocateSession(ctx, st, "", session("node-a", 2, "").ID)
	if err != nil || s.Node != "node-a" || s.Name != "s2" {
		t.Errorf("by id: %+v, %v", s, err)
	}
	s, err = directory.LocateSession(ctx, st, "", "s9")
	if err != nil || s.Node != "node-b" || s.ID != session("node-b", 9, "").ID {
		t.Errorf("by name: %+v, %v", s, err)
	}
	_, err = directory.LocateSession(ctx, st, "", "s1")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "on node-a") || !strings.Contains(err.Error(), "on node-b") ||
		!strings.Contains(err.Error(), "give the session's id") {
		t.Errorf("a name on two nodes: %v", err)
	}
	for _, ref := range []string{"ses_nosuch", "nosuch"} {
		_, err := directory.LocateSession(ctx, st, "", ref)
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), fmt.Sprintf("no session %q in the fleet's directory", ref)) {
			t.Errorf("%s: %v", ref, err)
		}
	}
	for _, ref := range []string{"", "ses_a/b"} {
		if _, err := directory.LocateSession(ctx, st, "", ref); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v", ref, err)
		}
	}

	if _, err := directory.MarkLost(ctx, st, "", "node-b"); err != nil {
		t.Fatal(err)
	}
	s, err = directory.LocateSession(ctx, st, "", "s9")
	if err != nil || s.State != directory.StateLost || s.LastState != "running" {
		t.Errorf("a lost session by name: %+v, %v", s, err)
	}

	list, err := directory.ListSessions(ctx, st, "")
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, s := range list {
		order = append(order, s.Node+"/"+s.Name)
	}
	if want := []string{"node-a/s0", "node-a/s1", "node-a/s2", "node-b/s1", "node-b/s9"}; !slices.Equal(order, want) {
		t.Errorf("ListSessions order %v; want %v", order, want)
	}
}

func TestPublishSessionsRefuses(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	st := open(t, c.Endpoints())
	list := func() ([]directory.Session, error) { return nil, nil }
	for _, cfg := range []directory.SessionsConfig{
		{Store: st, Node: "", List: list},
		{Store: st, Node: "a/b", List: list},
		{Store: st, Node: "node-a"},
		{Node: "node-a", List: list},
		{Store: st, Node: "node-a", List: list, Interval: -time.Second},
		{Store: st, Node: "node-a", List: list, Resync: -time.Second},
	} {
		p, err := directory.PublishSessions(cfg)
		if err == nil {
			_ = p.Stop(context.Background())
			t.Errorf("%+v: publishing", cfg)
		} else if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}
