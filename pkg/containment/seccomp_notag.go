//go:build !seccomp

package containment

// seccompBuilt: this binary was built without the seccomp build tag, so libcontainer
// cannot install a seccomp filter and sealed sessions are unavailable.
const seccompBuilt = false
