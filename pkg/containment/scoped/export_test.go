package scoped

// What the package's external tests (package scoped_test) reach of its insides: what a
// scoped session's program is held by, without the rest of its start.
var (
	SeccompOf = scopedSeccomp
	ExecRules = scopedExec
)
