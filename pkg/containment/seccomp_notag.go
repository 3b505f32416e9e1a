//go:build !seccomp

package containment

import (
	"errors"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// seccompBuilt: this binary was built without the seccomp build tag, so libcontainer
// cannot install a seccomp filter and sealed sessions are unavailable.
const seccompBuilt = false

func compileSeccomp(*specs.LinuxSeccomp) ([]byte, error) {
	return nil, errors.New("roostd was built without seccomp support (the seccomp build tag)")
}
