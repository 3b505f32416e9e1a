// Package sysview works out what of the host's system trees a session sees — the closure
// of its exec allowlist — and builds the view of it a session's root is made from.
//
// Landlock's EXECUTE right decides what a session may exec, but the ELF loader, which
// every dynamic program needs executable, maps any file it can read: ld.so /usr/bin/perl
// runs perl. So a session must not read what it may not run. Resolve follows a session's
// allowed files, exec trees and read trees to everything running them needs — #!
// interpreters, ELF loaders and libraries, found where glibc's loader finds them, and what
// glibc loads behind a program's back — without running anything. Builder lays the
// closure out as a directory of hard links and symlinks, with empty directories where the
// trees it holds whole get mounted.
//
// The closure is of the system trees only (/usr, /bin, /sbin, /lib*, /opt): files met
// elsewhere (a capsule's own, anything under /etc) are followed for what they need and
// reported apart, for the caller to place. What programs load by name at run time beyond
// glibc's own (plugins, OpenSSL providers, a Python ctypes.CDLL) is not in it unless a
// tree holds it.
package sysview
