package manifest

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"1": 1, "4096": 4096, "64Ki": 64 << 10, "64Mi": 64 << 20, "4Gi": 4 << 30, "1Ti": 1 << 40, "7Ei": 7 << 60,
		"64k": 64e3, "64M": 64e6, "4G": 4e9, "2T": 2e12, "9E": 9e18,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{
		"": "expected a size", "64mb": "expected a size", "4g": "expected a size", "1.5Gi": "expected a size",
		"-5": "expected a size", "Mi": "expected a size", " 64Mi": "expected a size", "64 Mi": "expected a size",
		"0Mi": "greater than 0", "0": "greater than 0", "8Ei": "does not fit", "99999999999999999999": "does not fit",
	} {
		if _, err := ParseSize(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseSize(%q): %v, want an error saying %q", in, err, msg)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{
		1: "1", 1023: "1023", 1000: "1k", 1024: "1Ki", 64 << 20: "64Mi", 1 << 30: "1Gi", 4e9: "4G", 2048000: "2000Ki", 7 << 60: "7Ei",
	} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// A capsule's sizes take units; one that does not read is refused at its field and line.
func TestSizesInManifest(t *testing.T) {
	const head = "name: s\nversion: 0.1.0\nrun:\n  command: [\"true\"]\ncapabilities:\n  containment: scoped\n"
	m := mustParse(t, head+"  resources:\n    cgroup_memory_bytes: 64Mi\n    workdir_max_bytes: 4G\n    log_max_bytes: 1048576\n")
	r := Lower(m).Resources
	if r.CgroupMemoryBytes.Value != 64<<20 || r.WorkdirMaxBytes.Value != 4e9 || r.LogMaxBytes.Value != 1<<20 {
		t.Errorf("sizes: %d %d %d", r.CgroupMemoryBytes.Value, r.WorkdirMaxBytes.Value, r.LogMaxBytes.Value)
	}
	e := parseErr(t, head+"  resources:\n    cgroup_memory_bytes: 64mb\n")
	if len(e.Fields) != 1 || e.Fields[0].Path != "capabilities.resources.cgroup_memory_bytes" || e.Fields[0].Line != 8 ||
		!strings.Contains(e.Fields[0].Msg, `64Mi, 4Gi`) || !strings.Contains(e.Fields[0].Msg, `"64mb"`) {
		t.Errorf("error: %v", e)
	}
	// A zero size in the file says how to get the default; ParseSize alone, for a flag, does not.
	if e := parseErr(t, head+"  resources:\n    cgroup_memory_bytes: 0Mi\n"); !strings.Contains(e.Error(), "must be greater than 0 (leave the key out for the default)") {
		t.Errorf("error: %v", e)
	}
	if _, err := ParseSize("0"); err == nil || strings.Contains(err.Error(), "key") {
		t.Errorf("ParseSize(0): %v", err)
	}
	// Counts are not sizes: a unit there is refused.
	if e := parseErr(t, head+"  resources:\n    cgroup_pids_max: 4Ki\n"); !strings.Contains(e.Error(), "expected a whole number") {
		t.Errorf("error: %v", e)
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"64Mi", "4G", "0", "8Ei", "1.5Gi", "", "99999999999999999999k", "+5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err == nil && v <= 0 {
			t.Fatalf("ParseSize(%q) = %d with no error", s, v)
		}
		if err == nil {
			if back, err := ParseSize(FormatSize(v)); err != nil || back != v {
				t.Fatalf("ParseSize(FormatSize(%d)) = %d, %v", v, back, err)
			}
		}
		// ParseInt also reads "+5", which ParseSize refuses: digits only.
		if n, perr := strconv.ParseInt(s, 10, 64); perr == nil && n > 0 && strings.TrimLeft(s, "0123456789") == "" && (err != nil || v != n) {
			t.Fatalf("ParseSize(%q) = %d, %v; a plain number is itself", s, v, err)
		}
	})
}
