package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/containment/idsweep"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session"
	"roost.dev/roost/pkg/session/dirs"
	"roost.dev/roost/pkg/session/store"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
)

func doctor(t *testing.T, ids store.IDPool, sealed error) *roostv1.DoctorResponse {
	t.Helper()
	return doctorWith(t, t.TempDir(), ids, sealed)
}

func doctorOn(t *testing.T, state string) *roostv1.DoctorResponse {
	t.Helper()
	return doctorWith(t, state, store.IDPool{}, nil)
}

func doctorWith(t *testing.T, state string, ids store.IDPool, sealed error) *roostv1.DoctorResponse {
	t.Helper()
	s := &systemService{cfg: Config{
		StateDir: state,
		IDs:      ids,
		Assess: func(context.Context) (containment.Host, containment.Catalog) {
			host := containment.Probe()
			return host, containment.NewCatalog(host, nil, sealed)
		},
	}}
	resp, err := s.Doctor(context.Background(), &roostv1.DoctorRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func sealedReport(t *testing.T, resp *roostv1.DoctorResponse) *roostv1.ClassReport {
	t.Helper()
	for _, c := range resp.GetClasses() {
		if c.GetClass() == "sealed" {
			return c
		}
	}
	t.Fatalf("no sealed class in %v", resp.GetClasses())
	return nil
}

func TestDoctorUserNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mapping roostd's ids needs root")
	}
	if containment.Probe().UserNamespaces == 0 {
		t.Skip("user namespaces are off (user.max_user_namespaces = 0)")
	}
	resp := doctor(t, store.IDPool{}, nil)
	u := resp.GetUserNamespaces()
	if !u.GetAvailable() || u.GetMax() <= 0 || !u.GetMappingWorks() || u.GetDetail() != "" {
		t.Fatalf("user namespaces on a root host: %v", u)
	}
	// A zero pool is roostd's default block.
	if u.GetIdFirst() != 1879048192 || u.GetIdLast() != 2147352575 || u.GetRanges() != 4094 || u.GetIdsPerSession() != 65536 {
		t.Fatalf("id block: %v", u)
	}
	if len(u.GetConflicts()) > 0 != (u.GetHint() != "") {
		t.Fatalf("conflicts %q with hint %q", u.GetConflicts(), u.GetHint())
	}
	for _, c := range resp.GetChecks() {
		if strings.Contains(c.GetName(), "user namespace") || strings.Contains(c.GetName(), "apparmor") {
			t.Errorf("user namespaces reported twice, as check %q too", c.GetName())
		}
	}

	// A block the kernel cannot map: the failure is in the report, and the sealed class's
	// line names it as the thing to fix.
	resp = doctor(t, store.IDPool{First: 1<<32 - 65536, Slots: 1}, errors.New("libcontainer said no"))
	u = resp.GetUserNamespaces()
	if u.GetMappingWorks() || !strings.Contains(u.GetDetail(), "sessions.ids.first") {
		t.Fatalf("an unmappable block: %v", u)
	}
	if u.GetIdFirst() != 4294901760 || u.GetIdLast() != 4294967295 || u.GetRanges() != 1 {
		t.Fatalf("id block: %v", u)
	}
	sealed := sealedReport(t, resp)
	if d := sealed.GetDetail(); sealed.GetAvailable() || !strings.Contains(d, "libcontainer said no") || !strings.Contains(d, "roostd cannot create one: "+u.GetDetail()) {
		t.Fatalf("sealed: %v", sealed)
	}
	// A sealed class that is available says nothing of it.
	resp = doctor(t, store.IDPool{First: 1<<32 - 65536, Slots: 1}, nil)
	if d := sealedReport(t, resp).GetDetail(); strings.Contains(d, "user namespace's") {
		t.Fatalf("sealed: %s", d)
	}
}

// Session trees on a mount that honours setuid bits and device nodes fail doctor's check,
// naming each and what to do; roostd's own, sealed, pass it (test/e2e TestSessionTreesSealed).
func TestDoctorUnsealedTrees(t *testing.T) {
	state := t.TempDir()
	if len(dirs.CheckSealed(state)) == 0 {
		testenv.Need(t, "a temporary directory on a mount without nosuid,nodev", errors.New(state+" is on a nosuid,nodev mount"))
	}
	for _, tree := range dirs.Trees(state) {
		if err := os.Mkdir(tree, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	var check *roostv1.HostCheck
	for _, c := range doctorOn(t, state).GetChecks() {
		if c.GetName() == "session trees nosuid,nodev" {
			check = c
		}
	}
	if check == nil {
		t.Fatal("doctor has no session trees check")
	}
	if check.GetStatus() != "fail" || !strings.Contains(check.GetHint(), "restart roostd") {
		t.Fatalf("unsealed trees: %v", check)
	}
	for _, tree := range dirs.Trees(state) {
		if !strings.Contains(check.GetDetail(), tree+" is on a mount without nosuid") {
			t.Errorf("the check does not name %s: %s", tree, check.GetDetail())
		}
	}
}

// stuckSweeper fails every sweep, as one a leftover process keeps failing would.
type stuckSweeper struct{}

func (stuckSweeper) Sweep(idsweep.Ranges) (idsweep.Report, error) {
	return idsweep.Report{}, errors.New("pid 4242 kept appearing")
}

// TestDoctorQuarantinedRanges: a range whose sweep failed is a warning that names it, who
// held it and why; with every range held or quarantined, the check fails and says what to do.
func TestDoctorQuarantinedRanges(t *testing.T) {
	state := t.TempDir()
	if err := os.Chmod(filepath.Dir(state), 0o711); err != nil {
		t.Fatal(err)
	}
	host := containment.Host{Root: os.Geteuid() == 0}
	rt := containment.NewProcessRuntime(containment.SelfInit)
	pool := store.IDPool{First: testPool.First, Slots: 2}
	m, err := session.Open(session.Config{
		IDs: pool, Sweeper: stuckSweeper{},
		StateDir: state, Host: host, Catalog: containment.NewCatalog(host, containment.ErrNoRuntime, containment.ErrNoRuntime),
		Runtimes: map[manifest.Class]session.Runtime{manifest.Advisory: rt, manifest.Unconfined: rt},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s := &systemService{cfg: Config{Sessions: m, StateDir: state, IDs: pool, Assess: func(context.Context) (containment.Host, containment.Catalog) {
		return host, containment.NewCatalog(host, containment.ErrNoRuntime, containment.ErrNoRuntime)
	}}}
	check := func() *roostv1.HostCheck {
		t.Helper()
		resp, err := s.Doctor(context.Background(), &roostv1.DoctorRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range resp.GetChecks() {
			if c.GetName() == "id ranges" {
				return c
			}
		}
		t.Fatal("no id ranges check")
		return nil
	}
	if c := check(); c.GetStatus() != "ok" || c.GetDetail() != "1 free, 0 held, 0 waiting for their sweep, 0 quarantined" {
		t.Fatalf("before: %+v", c)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), []byte("name: x\nversion: 0.1.0\nrun:\n  command: [\"true\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec, err := m.Stage(session.StageOptions{Capsule: dir})
	if err != nil {
		t.Fatal(err)
	}
	// It runs on its range, so the range is to be swept once it is removed.
	if _, err := m.Launch(context.Background(), rec.ID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := m.Wait(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(rec.ID); err != nil {
		t.Fatal(err)
	}
	c := check()
	want := fmt.Sprintf("%d (last held by %s; 1 tries: pid 4242 kept appearing)", rec.IDs.First, rec.ID)
	if c.GetStatus() != "fail" || !strings.Contains(c.GetDetail(), "0 free, 0 held, 0 waiting for their sweep, 1 quarantined: "+want) || !strings.Contains(c.GetHint(), "no range is free") {
		t.Fatalf("after a failed sweep: %+v", c)
	}
}
