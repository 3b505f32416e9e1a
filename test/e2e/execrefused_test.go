package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An exec the allowlist refuses, through roostd: the session's trace records it with the
// program that tried and how often, its events name the path, inspect counts it and the
// metric by class.
func TestExecRefusedRecordedThroughRoostd(t *testing.T) {
	d := newDaemon(t)
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{}
	for _, class := range []string{"scoped", "sealed"} {
		t.Run(class, func(t *testing.T) {
			dir := capsule(t, "refused"+class, `/usr/bin/id; i=0; while [ $i -lt 5 ]; do /usr/bin/id 2>/dev/null; i=$((i+1)); done; echo done`,
				"capabilities:\n  containment: "+class+"\n  shell:\n    allow: [cat]\n")
			out := d.ok("run", dir)
			if !strings.Contains(out, "done") || strings.Contains(out, "uid=") {
				t.Fatalf("run: %q", out)
			}
			list := d.ps()
			s := d.inspect(list[len(list)-1].ID)

			var traced int64
			f, err := os.Open(filepath.Join(s.RecordsDir, "trace.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 64<<10), 16<<20)
			for sc.Scan() {
				var r struct {
					EventType string `json:"event_type"`
					Path      string `json:"path"`
					Argv0     string `json:"argv0"`
					Program   string `json:"program"`
					Reason    string `json:"reason"`
					Count     int64  `json:"count"`
				}
				if json.Unmarshal(sc.Bytes(), &r) != nil || r.EventType != "exec_refused" {
					continue
				}
				if r.Path != "/usr/bin/id" || r.Program != sh || r.Argv0 != "/usr/bin/id" || r.Reason == "" {
					t.Errorf("trace: %s", sc.Text())
				}
				traced += r.Count
			}
			if traced != 6 {
				t.Errorf("the trace records %d refused execs of /usr/bin/id, want 6", traced)
			}

			noted := 0
			for _, ev := range d.events(0) {
				if ev.SessionID == s.ID && ev.Type == "session.exec_refused" {
					noted++
					if !strings.Contains(ev.Detail, "/usr/bin/id") || !strings.Contains(ev.Detail, sh) {
						t.Errorf("event: %+v", ev)
					}
				}
			}
			if noted == 0 {
				t.Errorf("no session.exec_refused event for %s", s.ID)
			}

			var ins struct {
				ExecRefused struct {
					Count       string   `json:"count"`
					RecentPaths []string `json:"recent_paths"`
				} `json:"exec_refused"`
			}
			if err := json.Unmarshal([]byte(d.ok("inspect", "--json", s.ID)), &ins); err != nil {
				t.Fatal(err)
			}
			if ins.ExecRefused.Count != "6" || len(ins.ExecRefused.RecentPaths) != 1 || ins.ExecRefused.RecentPaths[0] != "/usr/bin/id" {
				t.Errorf("inspect: %+v", ins.ExecRefused)
			}
			if human := d.ok("inspect", s.ID); !strings.Contains(human, "6 refused by the exec allowlist") {
				t.Errorf("inspect:\n%s", human)
			}
			want[class] = 6
		})
	}
	resp, err := http.Get("http://" + d.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for class, n := range want {
		if line := fmt.Sprintf(`roost_exec_refused_total{class=%q} %d`, class, n); !strings.Contains(string(body), line) {
			t.Errorf("metrics lack %q", line)
		}
	}
}
