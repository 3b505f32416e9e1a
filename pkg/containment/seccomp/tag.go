//go:build seccomp

package seccomp

// Built says libseccomp is linked in (the seccomp build tag): libcontainer can install a
// filter, and Compile can make one.
const Built = true
