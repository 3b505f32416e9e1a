// Package seccomp owns the seccomp filter every session with a kernel sandbox gets: moby's
// default profile with roost's own rules (no AF_UNIX sockets unless network.unix_sockets,
// no new namespaces, no ptrace), as an OCI profile libcontainer installs for a sealed session,
// or compiled to BPF here for roost-exec to install in a scoped one.
//
// It is its own package, below both runtimes, because the sealed and the scoped runtime share
// one filter and neither may import the other; it sits apart from the core so that what
// links libseccomp (the seccomp build tag) is one package. It knows nothing of sessions,
// specs or runtimes: it must not import any other package of roost.
package seccomp
