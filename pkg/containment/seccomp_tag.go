//go:build seccomp

package containment

// seccompBuilt: libcontainer was built with seccomp support (the seccomp build tag).
const seccompBuilt = true
