// Package version names the build. The linker sets Version and Commit (see the Makefile);
// nothing else writes them.
package version

// Set with -ldflags "-X roost.dev/roost/pkg/version.Version=... -X ...Commit=...".
var (
	Version = "dev"
	Commit  = ""
)
