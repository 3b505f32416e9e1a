package containment_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/records"
)

func TestReportLandsInExitRecord(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", testkit.FDScript+`echo '{"status":"crashed", "detail":"wasm trap: wasm `+"`unreachable`"+` instruction executed","backtrace":"0: 0x29 - <unknown>!f"}' >&$ROOST_REPORT_FD; exit 134`)
	// A variable of the session's own never chooses the descriptor.
	s.Env = append(s.Env, "ROOST_REPORT_FD=9")
	info, out := kit.ReportRun(t, containment.SelfInit, s, roostinit.ExecSpec{Report: true})
	if info.Code != 134 {
		t.Fatalf("exit %+v", info)
	}
	nums, env := testkit.FDs(t, out)
	if !slices.Equal(nums, []string{"0", "1", "2", "3"}) || env != "3" {
		t.Fatalf("the program has descriptors %v and ROOST_REPORT_FD=%s; want 0-3 and 3:\n%s", nums, env, out)
	}
	o, ok := info.Outcome()
	if !ok || o.Status != records.OutcomeCrashed || o.Detail != "wasm trap: wasm `unreachable` instruction executed" || o.Backtrace != "0: 0x29 - <unknown>!f" {
		t.Fatalf("report %s -> %+v %v", info.Report, o, ok)
	}
}

func TestReportGarbageDropped(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", `echo 'not json {' >&$ROOST_REPORT_FD; exit 1`)
	info, _ := kit.ReportRun(t, containment.SelfInit, s, roostinit.ExecSpec{Report: true})
	if info.Code != 1 || info.Report != nil {
		t.Fatalf("exit %+v", info)
	}
	if log := testkit.ReadFile(t, filepath.Join(s.RecordsDir, records.InitLogFile)); !strings.Contains(log, "not one JSON object") {
		t.Fatalf("init.log says %q", log)
	}
}

func TestReportNotWritten(t *testing.T) {
	// A descendant keeps the descriptor past the program's end: it is reaped with the
	// session, and the record does not wait for it.
	s := kit.Spec(t, "/bin/sh", "-c", `sleep 300 & exit 0`)
	info, _ := kit.ReportRun(t, containment.SelfInit, s, roostinit.ExecSpec{Report: true})
	if info.Code != 0 || info.Report != nil {
		t.Fatalf("exit %+v", info)
	}
}

func TestReportNoDescriptorWithoutReport(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", testkit.FDScript+`exit 0`)
	s.Env = append(s.Env, "ROOST_REPORT_FD=3")
	info, out := kit.ReportRun(t, containment.SelfInit, s, roostinit.ExecSpec{})
	nums, env := testkit.FDs(t, out)
	if info.Code != 0 || info.Report != nil || !slices.Equal(nums, []string{"0", "1", "2"}) || env != "unset" {
		t.Fatalf("exit %+v; the program has descriptors %v and ROOST_REPORT_FD=%s:\n%s", info, nums, env, out)
	}
}
