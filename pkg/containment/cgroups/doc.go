// Package cgroups owns a session's cgroup: where sessions' cgroups go (the parent, the
// cgroupfs or systemd driver, roostd's own move into a leaf of a delegated cgroup), making
// one with its limits and starting a process right into it, noting where it went so that a
// later daemon finds it, reading its usage and ceilings, and ending and removing it.
//
// It must not know what runs in the cgroup: no session spec, process or runtime, nothing
// of containment's classes. It imports no other package of roost; the core and the runtimes
// import it (as they import libcontainer's cgroups, which this one wraps).
package cgroups
