package testkit

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
)

// SealedSpec is the start of script as sealed session id with the capabilities caps.
func (k *Kit) SealedSpec(t *testing.T, id, caps, script string) containment.Spec {
	t.Helper()
	s := k.Spec(t, "/bin/sh", "-c", script)
	s.SessionID = id
	s.Class = manifest.Sealed
	s.Policy = Policy(t, caps)
	s.CapsuleDir = t.TempDir()
	s.Env = []string{"PATH=/usr/bin:/bin"}
	return s
}

// ClaimSandbox gives s a sandbox's ids and (unless "") records directory, as roostd gives
// them to the session that claims it.
func ClaimSandbox(t *testing.T, s *containment.Spec, ids containment.IDs, records string) {
	t.Helper()
	s.IDs = ids
	if err := os.Chown(s.Dir, int(ids.First), int(ids.First)); err != nil {
		t.Fatal(err)
	}
	if records == "" {
		return
	}
	if err := os.Remove(s.RecordsDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(records, s.RecordsDir); err != nil {
		t.Fatal(err)
	}
}

// Prepare makes a sandbox of the shape, as roostd's pool does.
func (k *Kit) Prepare(t *testing.T, rt *sealed.Runtime, shape sealed.WarmShape, name string) *sealed.Sandbox {
	t.Helper()
	records := filepath.Join(ReachableDir(t), "records")
	if err := os.Mkdir(records, 0o700); err != nil {
		t.Fatal(err)
	}
	sb, err := rt.Prepare(context.Background(), shape, sealed.WarmPrefix+name, k.IDs(), "", records)
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	return sb
}

// StartSealed starts script as sealed session id with the capabilities caps.
func (k *Kit) StartSealed(t *testing.T, rt *sealed.Runtime, id, script, caps string) (containment.Process, containment.Spec) {
	t.Helper()
	s := k.SealedSpec(t, id, caps, script)
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatalf("sealed start: %v", err)
	}
	return p, s
}

// sessionID names the test's session after it.
func sessionID(t *testing.T) string {
	return "ses_" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "_")
}

// SealedRun runs a shell script as a sealed session and returns its exit and output. With
// -warm (see Main) the session starts in a sandbox made ahead: of a default capsule's shape
// when it fits, else of one made for its own policy, as roostd --warm-pool-capsule makes.
func (k *Kit) SealedRun(t *testing.T, caps, script string) (containment.ExitInfo, string, string, containment.Spec) {
	t.Helper()
	NeedRoot(t)
	rt, err := k.NewSealedRuntime(ReachableDir(t), k.Init(t), k.IDs(), k.Sealer(t))
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(sessionID(t), "ses_")
	s := k.SealedSpec(t, "ses_"+name, caps, script)
	s.Env = append(s.Env, "HOME=/work")
	var p containment.Process
	if k.Warm() {
		shape := sealed.DefaultWarmShape()
		if rt.Fits(shape, s.Policy, false) != nil {
			shape = sealed.WarmShape{Name: "its own", Policy: s.Policy}
		}
		sb := k.Prepare(t, rt, shape, name)
		ClaimSandbox(t, &s, sb.IDs, sb.Records)
		p, err = rt.StartWarm(context.Background(), sb, s)
	} else {
		p, err = rt.Start(context.Background(), s)
	}
	if err != nil {
		t.Fatalf("sealed start: %v", err)
	}
	info := WaitDone(t, p)
	if err := rt.Release(s.SessionID); err != nil {
		t.Errorf("release: %v", err)
	}
	out := ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile))
	errOut := ReadFile(t, filepath.Join(s.RecordsDir, containment.StderrFile))
	return info, out, errOut, s
}

// ScopedRun runs a shell script as a scoped session and returns its exit and output.
func (k *Kit) ScopedRun(t *testing.T, caps, script string) (containment.ExitInfo, string, string, containment.Spec) {
	t.Helper()
	NeedRoot(t)
	rt, err := k.NewScopedRuntime(ReachableDir(t), k.Init(t), k.IDs())
	if err != nil {
		t.Fatal(err)
	}
	s := k.Spec(t, "/bin/sh", "-c", script)
	s.SessionID = sessionID(t)
	s.Class = manifest.Scoped
	s.Policy = Policy(t, caps)
	s.CapsuleDir = t.TempDir()
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatalf("scoped start: %v", err)
	}
	info := WaitDone(t, p)
	if err := rt.Release(s.SessionID); err != nil {
		t.Errorf("release: %v", err)
	}
	return info, ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)), ReadFile(t, filepath.Join(s.RecordsDir, containment.StderrFile)), s
}

// AdvisoryRun runs a shell script as an advisory session (the plain runtime: the host's
// namespaces, its own uid and cgroup) and returns its exit and output: the positive control
// of what a scoped or sealed session must not reach.
func (k *Kit) AdvisoryRun(t *testing.T, script string) (containment.ExitInfo, string, string, containment.Spec) {
	t.Helper()
	NeedRoot(t)
	rt := k.NewProcessRuntime(k.Init(t))
	s := k.Spec(t, "/bin/sh", "-c", script)
	s.SessionID = sessionID(t)
	s.Class = manifest.Advisory
	s.Policy = Policy(t, "capabilities: {containment: advisory}")
	s.CapsuleDir = t.TempDir()
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatalf("advisory start: %v", err)
	}
	info := WaitDone(t, p)
	if err := rt.Release(s.SessionID); err != nil {
		t.Errorf("release: %v", err)
	}
	return info, ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)), ReadFile(t, filepath.Join(s.RecordsDir, containment.StderrFile)), s
}
