// Package testenv is how a test says what it needs from the machine it runs on. On a
// developer's machine a missing prerequisite skips the test; on CI (CI set, as CI systems
// set it) it fails it, because .ci/run installs everything the tests need and a test that
// skips there checks nothing while the run stays green.
package testenv

import (
	"os"
	"strconv"
	"testing"
)

// OnCI reports whether the tests run on CI: CI set to anything strconv.ParseBool does not
// read as false (CI=true, CI=1, and the CI=yes some systems set).
func OnCI() bool {
	v, ok := os.LookupEnv("CI")
	if !ok || v == "" {
		return false
	}
	if b, err := strconv.ParseBool(v); err == nil {
		return b
	}
	return true
}

// Need stops t when err says that what (a tool, a build product, a privilege) is missing:
// a skip locally, a failure on CI. A nil err lets the test go on.
func Need(t testing.TB, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if OnCI() {
		t.Fatalf("%s is missing on CI, where .ci/run should have provided it: %v", what, err)
		return // for a testing.TB whose Fatalf returns; testing.T's does not
	}
	t.Skipf("%s is missing (on CI this fails): %v", what, err)
}

// NeedRoot is Need for running as root.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Need(t, "root", errNotRoot(why))
	}
}

type errNotRoot string

func (e errNotRoot) Error() string {
	return "running as uid " + strconv.Itoa(os.Geteuid()) + ": " + string(e)
}
