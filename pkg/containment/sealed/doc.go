// Package sealed is the sealed runtime: each session's program in a libcontainer container
// of its own (a user namespace whose root is an unprivileged host uid range; mount, pid,
// ipc, uts, net and cgroup namespaces; a composed read-only root; seccomp; no
// capabilities), described as the OCI spec (OCISpec) that roostctl explain --oci prints,
// and started from this process or through roost-sealer. It also makes sandboxes ahead of
// their sessions (roostd's warm pool), which a session claims and makes its own.
//
// It builds on the core (roost-init, the process records, exec) and takes its cgroup from
// package cgroups and its filter from package seccomp. It must not reach into the scoped
// runtime, nor anything of pkg/containment into it. Every binary that starts sealed
// sessions must link its init (sealed_init.go), which importing it does.
package sealed
