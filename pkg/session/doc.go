// Package session runs sessions: it stages, launches, watches, stops, recovers and removes
// them, holding each live one's process, endpoint and timers, and writes what it sees to the
// record (pkg/session/store). Where things happen:
//
//	stage.go      a session is created (capsule read, policy lowered, containment decided)
//	launch.go     it is launched under its containment runtime
//	supervise.go  its deadline, stop and kill, and the recording of its end
//	recover.go    a restarted daemon reconciles what the registry says with what runs
//	remove.go     it is forgotten
//
// What it joins, each answering one question: plan (what a session will be), spec (the
// program's start), dirs (its trees on the host), account (its ledger account), guard
// (what it holds on disk), outcome (how it ended), exec (one more command in it), delegate
// (what its endpoint serves), warmpool (sandboxes made ahead) and retention (when an
// ended one goes).
package session
