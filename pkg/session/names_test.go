package session

import (
	"context"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/pkg/session/store"

	"github.com/containerd/errdefs"
)

// A name is unique among the sessions the registry holds, is refused before anything is
// recorded when bad or taken, and frees up when its session is removed.
func TestNameUniqueAndFreedOnRemove(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	dir := capsule(t, "true", "")
	web, err := m.Stage(StageOptions{Capsule: dir, Name: "web"})
	if err != nil || web.Name != "web" {
		t.Fatalf("stage --name web: %+v %v", web, err)
	}
	if got, err := m.Get("web"); err != nil || got.ID != web.ID || got.Name != "web" {
		t.Fatalf("Get(web): %+v %v", got, err)
	}
	events := lastSeq(t, m)
	_, err = m.Stage(StageOptions{Capsule: dir, Name: "web"})
	if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), web.ID) || !strings.Contains(err.Error(), `name "web" is taken`) {
		t.Fatalf("second stage --name web: %v", err)
	}
	_, err = m.Stage(StageOptions{Capsule: dir, Name: "Web!"})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `name "Web!"`) {
		t.Fatalf("stage --name Web!: %v", err)
	}
	if n := len(mustList(t, m)); n != 1 || lastSeq(t, m) != events {
		t.Fatalf("a refused name recorded something: %d sessions, events %d -> %d", n, events, lastSeq(t, m))
	}
	// The index, not the pre-check, holds the line: a claim in the record's own
	// transaction refuses the name too.
	if _, err := m.reg.Update(func(tx *store.Tx) error {
		return tx.Create(&store.Record{ID: "ses_dup", Name: "web"}, []byte("m"), []byte("e"))
	}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Create with a taken name: %v", err)
	}
	// Another name, and no name, live beside it.
	if _, err := m.Stage(StageOptions{Capsule: dir, Name: "api"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Stage(StageOptions{Capsule: dir}); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("web"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get("web"); !errdefs.IsNotFound(err) {
		t.Fatalf("Get(web) after rm: %v", err)
	}
	again, err := m.Stage(StageOptions{Capsule: dir, Name: "web"})
	if err != nil || again.ID == web.ID {
		t.Fatalf("stage --name web after rm: %+v %v", again, err)
	}
	if got, err := m.Get("web"); err != nil || got.ID != again.ID {
		t.Fatalf("Get(web) names the new session: %+v %v", got, err)
	}
}

// Prune (and retention, which removes the same way) frees the names of what it removes.
func TestNameFreedByPrune(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	dir := capsule(t, "true", "")
	rec := run(t, m, StageOptions{Capsule: dir, Name: "job"})
	waitEnd(t, m, rec.ID)
	if _, err := m.Stage(StageOptions{Capsule: dir, Name: "job"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("an ended session keeps its name until removed: %v", err)
	}
	if _, err := m.Prune(0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Stage(StageOptions{Capsule: dir, Name: "job"}); err != nil {
		t.Fatalf("stage --name job after prune: %v", err)
	}
}

func TestNameSurvivesRestart(t *testing.T) {
	state := stateDir(t)
	m, _ := openManager(t, state)
	dir := capsule(t, "true", "")
	rec, err := m.Stage(StageOptions{Capsule: dir, Name: "keeper"})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	m, _ = openManager(t, state)
	if got, err := m.Get("keeper"); err != nil || got.ID != rec.ID || got.Name != "keeper" {
		t.Fatalf("Get(keeper) after reopen: %+v %v", got, err)
	}
	if _, err := m.Stage(StageOptions{Capsule: dir, Name: "keeper"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("stage --name keeper after reopen: %v", err)
	}
}

// Real ids, made one after another, share their start: their short ids tell them apart.
func TestShortIDsOfRealSessions(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	dir := capsule(t, "true", "")
	var recs []*store.Record
	for range 3 {
		rec, err := m.Stage(StageOptions{Capsule: dir})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	if _, err := m.Get(recs[0].ID[:len("ses_")+4]); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("ids made together differ in their first %d characters: %v", len("ses_")+4, err)
	}
	for _, rec := range recs {
		short := store.ShortID(rec.ID)
		if len(short) != store.ShortIDLen || !strings.HasSuffix(rec.ID, short) {
			t.Fatalf("ShortID(%s) = %s", rec.ID, short)
		}
		if got, err := m.Get(short); err != nil || got.ID != rec.ID {
			t.Fatalf("Get(%s): %+v %v", short, got, err)
		}
		if got, err := m.Get(short[:8]); err != nil || got.ID != rec.ID {
			t.Fatalf("Get(%s): %+v %v", short[:8], got, err)
		}
	}
	// Every operation resolves the same way: launch by short id, wait by it.
	if _, err := m.Launch(context.Background(), store.ShortID(recs[0].ID)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if rec, err := m.Wait(ctx, store.ShortID(recs[0].ID)); err != nil || rec.State != store.Exited {
		t.Fatalf("Wait by short id: %+v %v", rec, err)
	}
}

func lastSeq(t *testing.T, m *Manager) uint64 {
	t.Helper()
	var seq uint64
	m.reg.View(func(tx *store.Tx) error { seq = tx.LastSeq(); return nil })
	return seq
}

func mustList(t *testing.T, m *Manager) []*store.Record {
	t.Helper()
	recs, err := m.List(true)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
