// Package containment is what every class of session shares: a session's Spec and the
// Process a runtime makes of it, the Runtime interface the classes implement and the
// rehearsal that tries one (Rehearse), the host probe and the class decision (Probe,
// Catalog, Decide), how each grant is held (Grants), and the plain runtime of the classes
// without a kernel sandbox (unconfined, advisory), on which the others build: roost-init
// started and re-attached, its reports and exit records, one more command exec'd into a
// session.
//
// It must not know how a kernel sandbox is built (libcontainer, Landlock's rules, the OCI
// spec): that is each runtime's own package, scoped and sealed, which import this one and
// never the reverse. Below it are the mechanisms it and the runtimes share, which import
// nothing of it: cgroups (a session's cgroup), seccomp (the filter), roostinit (roost-init
// and roost-exec) and sealer (roost-sealer).
package containment
