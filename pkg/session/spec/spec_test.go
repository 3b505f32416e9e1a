package spec

import (
	"path/filepath"
	"slices"
	"testing"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/toolchain"
)

func TestLoginShell(t *testing.T) {
	bashFile, err := filepath.EvalSymlinks("/bin/bash")
	testenv.Need(t, "bash", err)
	dash, err := filepath.EvalSymlinks("/bin/dash")
	testenv.Need(t, "dash", err)
	for _, c := range []struct {
		name, declared string
		exec, trees    []string
		want           string
	}{
		{"bash allowed", "", []string{bashFile}, nil, "/bin/bash"},
		{"bash in an allowed tree", "", nil, []string{filepath.Dir(bashFile)}, "/bin/bash"},
		{"bash not allowed", "", []string{dash}, nil, "/bin/sh"},
		{"nothing allowed", "", nil, nil, "/bin/sh"},
		{"declared and allowed", "/bin/dash", []string{bashFile, dash}, nil, "/bin/dash"},
		{"declared, not allowed", "/bin/dash", []string{bashFile}, nil, "/bin/bash"},
		{"declared, missing", "/nonexistent/zsh", []string{bashFile}, nil, "/bin/bash"},
		{"declared relative", "dash", []string{bashFile, dash}, nil, "/bin/bash"},
	} {
		if got := LoginShell(c.declared, c.exec, c.trees); got != c.want {
			t.Errorf("%s: LoginShell(%q, %v, %v) = %s, want %s", c.name, c.declared, c.exec, c.trees, got, c.want)
		}
	}
}

// PATH gets a preset's directories off the default, SHELL the login shell, and the
// manifest's env wins over both.
func TestEnvironmentPathAndShell(t *testing.T) {
	rec := &store.Record{ID: "ses_x", Shell: []toolchain.Entry{{Entry: "@go", Path: []string{"/usr/local/go/bin"}}}}
	get := func(env []string, k string) string {
		for _, kv := range env {
			if len(kv) > len(k) && kv[:len(k)+1] == k+"=" {
				return kv[len(k)+1:]
			}
		}
		return ""
	}
	env := environment(rec, &manifest.Manifest{}, nil, sealedView, "/bin/bash", nil)
	if got, want := get(env, "PATH"), toolchain.DefaultPath+":/usr/local/go/bin"; got != want {
		t.Errorf("PATH %q, want %q", got, want)
	}
	if got := get(env, "SHELL"); got != "/bin/bash" {
		t.Errorf("SHELL %q", got)
	}
	env = environment(rec, &manifest.Manifest{Env: map[string]string{"PATH": "/mine", "SHELL": "/bin/zsh"}}, nil, sealedView, "/bin/bash", nil)
	if get(env, "PATH") != "/mine" || get(env, "SHELL") != "/bin/zsh" {
		t.Errorf("a declared PATH and SHELL did not win: %v", env)
	}
	if !slices.IsSorted(env) {
		t.Errorf("environment not sorted: %v", env)
	}
}

// The program and every argument staging found in the capsule are where a sealed session
// sees it; others are left as they are.
func TestCommandInTheView(t *testing.T) {
	rec := &store.Record{Capsule: store.CapsuleRef{Dir: "/state/capsules/ab12"},
		Command: []string{"/state/capsules/ab12/bin/run", "/state/capsules/ab12/app.py", "./out.txt", "/state/capsules/ab12x/y"}}
	got := sealedView.command(rec)
	want := []string{"/capsule/bin/run", "/capsule/app.py", "./out.txt", "/state/capsules/ab12x/y"}
	if !slices.Equal(got, want) {
		t.Errorf("command in the sealed view: %q, want %q", got, want)
	}
	if !slices.Equal(rec.Command, []string{"/state/capsules/ab12/bin/run", "/state/capsules/ab12/app.py", "./out.txt", "/state/capsules/ab12x/y"}) {
		t.Errorf("the record's command was changed: %q", rec.Command)
	}
}

// A sealed session's commands see its workdir at /work, from the moment it is staged with a
// sealed floor; every other class sees the host's path.
func TestWorkdir(t *testing.T) {
	for _, tc := range []struct {
		declared, achieved, want string
	}{
		{"sealed", "", "/work"},
		{"sealed", "sealed", "/work"},
		{"advisory", "sealed", "/work"},
		{"scoped", "scoped", "/srv/w"},
		{"advisory", "", "/srv/w"},
	} {
		rec := &store.Record{Workdir: "/srv/w", Declared: tc.declared, Achieved: tc.achieved}
		if got := Workdir(rec); got != tc.want {
			t.Errorf("declared %s, achieved %q: Workdir %q, want %q", tc.declared, tc.achieved, got, tc.want)
		}
	}
}
