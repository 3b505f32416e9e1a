// Package scoped is the scoped runtime: a session's program on the host's view of files,
// as an unprivileged uid of its own in a cgroup with limits and network, pid and IPC
// namespaces of its own (its /proc shows only its processes), held by what roost-exec
// applies before it execs it (Landlock's reads, writes and exec allowlist, noexec mounts of
// what it writes, no capabilities, no_new_privs, seccomp).
//
// It builds on the core's plain runtime (roost-init, the process tree, exec), and takes its
// cgroup from package cgroups and its filter from package seccomp. It must not reach into
// the sealed runtime, nor the core into it: nothing below cmd/roostd imports it but tests.
package scoped
