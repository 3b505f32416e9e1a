package store

// DetailOOM is the detail of a session the kernel's OOM killer ended (status crashed).
const DetailOOM = "oom"

// EndOOM is the roost_sessions_ended_total status of a crash by the OOM killer: split from
// crashed so that an operator can alert on memory bounds alone.
const EndOOM = "oom"

// EndStatuses are roost_sessions_ended_total's status labels: every exit status, and oom.
var EndStatuses = []string{string(StatusOK), string(StatusError), string(StatusCrashed), EndOOM,
	string(StatusTerminated), string(StatusDeadlineReached), string(StatusStartFailed), string(StatusLost)}

// EndStatus is the ended record's roost_sessions_ended_total status label.
func (r *Record) EndStatus() string {
	if r.ExitStatus == StatusCrashed && r.Detail == DetailOOM {
		return EndOOM
	}
	return string(r.ExitStatus)
}

// EndClass is the ended record's roost_sessions_ended_total class label: the class it ran
// under, or its floor when it never ran under one (a start that failed before its class was
// settled).
func (r *Record) EndClass() string {
	if r.Achieved != "" {
		return r.Achieved
	}
	return r.Declared
}
