//go:build !seccomp

package seccomp

import (
	"errors"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Built: this binary was built without the seccomp build tag, so libcontainer cannot
// install a seccomp filter and sealed sessions are unavailable.
const Built = false

// Compile cannot compile without libseccomp.
func Compile(*specs.LinuxSeccomp) ([]byte, error) {
	return nil, errors.New("roostd was built without seccomp support (the seccomp build tag)")
}
