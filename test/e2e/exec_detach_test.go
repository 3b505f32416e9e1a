package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/internal/testenv"
)

var execIDPattern = regexp.MustCompile(`^exec_[0-9a-f]{12}\n$`)

// detachedExec is one entry of exec ls --json.
type detachedExec struct {
	ExecID   string   `json:"exec_id"`
	Command  []string `json:"command"`
	State    string   `json:"state"`
	ExitCode *int     `json:"exit_code"`
	Signal   string   `json:"signal"`
	Detail   string   `json:"detail"`
	PID      int      `json:"pid"`
	EndedAt  string   `json:"ended_at"`
	Stdout   struct {
		WrittenBytes string `json:"written_bytes"`
		DroppedBytes string `json:"dropped_bytes"`
		MaxBytes     string `json:"max_bytes"`
	} `json:"stdout"`
}

// detach starts a detached exec and returns its id.
func (d *daemon) detach(id string, argv ...string) string {
	d.t.Helper()
	out := d.ok(append([]string{"exec", "-d", id, "--"}, argv...)...)
	if !execIDPattern.MatchString(out) {
		d.t.Fatalf("exec -d printed %q, not an exec id", out)
	}
	return strings.TrimSpace(out)
}

func (d *daemon) execs(id string) map[string]detachedExec {
	d.t.Helper()
	var list []detachedExec
	if err := json.Unmarshal([]byte(d.ok("exec", "ls", "--json", id)), &list); err != nil {
		d.t.Fatal(err)
	}
	out := map[string]detachedExec{}
	for _, x := range list {
		out[x.ExecID] = x
	}
	return out
}

// alive says whether pid still names a process that is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(data), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// A detached exec in a sealed or scoped session runs on without its client: attach from
// the start sees all it wrote and its exit, before and after it ended; wait returns its
// code; kill ends one with its signal; ls lists them; its output past its cap is cut with a
// marker; the 65th live one is refused naming the bound; after a roostd kill -9 the ended
// ones are still there and the running one is lost (and ended); rm -f ends those running.
func TestExecDetached(t *testing.T) {
	testenv.NeedRoot(t, "sealed and scoped sessions")
	for _, class := range []string{"sealed", "scoped"} {
		t.Run(class, func(t *testing.T) {
			d := newDaemon(t)
			id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "detach"+class, "exec sleep 600",
				"capabilities:\n  containment: "+class+"\n  shell:\n    allow: [sleep, sh, tty]\n  resources:\n    log_max_bytes: 1048576\n")))
			defer d.ctl("rm", "-f", id)

			counter := d.detach(id, "sh", "-c", "for i in 1 2 3; do echo $i; sleep 1; done; echo done >&2; exit 3")
			// Attached while it runs, from the start: all of it, then its end.
			res := d.ctl("exec", "attach", "--from-start", id, counter)
			if res.code != 3 || res.stdout != "1\n2\n3\n" || res.stderr != "done\n" {
				t.Fatalf("attach --from-start while it ran: %+v", res)
			}
			// After its end: the same from the records, and nothing new from now on.
			if res := d.ctl("exec", "attach", "--from-start", id, counter); res.code != 3 || res.stdout != "1\n2\n3\n" {
				t.Errorf("attach --from-start after the end: %+v", res)
			}
			if res := d.ctl("exec", "attach", id, counter); res.code != 3 || res.stdout != "" {
				t.Errorf("attach after the end: %+v", res)
			}
			if res := d.ctl("exec", "wait", id, counter); res.code != 3 {
				t.Errorf("exec wait: %+v", res)
			}

			// On a terminal of its own: its output is all stdout.
			onTTY := strings.TrimSpace(d.ok("exec", "-d", "-t", id, "--", "sh", "-c", "tty; echo oops >&2"))
			if res := d.ctl("exec", "attach", "--from-start", id, onTTY); res.code != 0 || !strings.HasPrefix(res.stdout, "/dev/pts/") || !strings.Contains(res.stdout, "oops") || res.stderr != "" {
				t.Errorf("a detached exec on a terminal: %+v", res)
			}

			sleeper := d.detach(id, "sleep", "1000")
			if x := d.execs(id)[sleeper]; x.State != "running" || x.PID == 0 || !alive(x.PID) {
				t.Fatalf("a detached sleep is not running: %+v", x)
			}
			if out := d.ok("exec", "kill", id, sleeper); !strings.Contains(out, "killed by SIGKILL") {
				t.Errorf("exec kill: %q", out)
			}
			if res := d.ctl("exec", "wait", id, sleeper); res.code != 137 {
				t.Errorf("exec wait of a killed exec: %+v", res)
			}
			if res := d.ctl("exec", "kill", id, sleeper); res.code != 0 || !strings.Contains(res.stderr, "exited") {
				t.Errorf("exec kill of an ended exec: %+v", res)
			}

			// 2000 lines, about 80 KB: past the exec's cap, 64 KiB under log_max_bytes 1 MiB.
			flood := d.detach(id, "sh", "-c", `i=0; while [ $i -lt 2000 ]; do echo "line $i 012345678901234567890123456789"; i=$((i+1)); done`)
			d.ok("exec", "wait", id, flood)
			out := d.ok("exec", "attach", "--from-start", id, flood)
			marker := regexp.MustCompile(`\n--- roost: (\d+) bytes of stdout dropped here \(a detached exec's sixty-fourth of resources\.log_max_bytes: 65536\) ---\n`)
			m := marker.FindStringSubmatch(out)
			if m == nil || !strings.HasPrefix(out, "line 0 ") || !strings.HasSuffix(out, "line 1999 012345678901234567890123456789\n") {
				t.Errorf("the flood's output is not cut with a marker (%d bytes): %.200q ... %.200q", len(out), out, out[max(len(out)-200, 0):])
			}

			written := 0
			for i := range 2000 {
				written += len(fmt.Sprintf("line %d 012345678901234567890123456789\n", i))
			}
			list := d.execs(id)
			for x, want := range map[string]string{counter: "exited with code 3", sleeper: "killed by SIGKILL", flood: "exited with code 0"} {
				if list[x].State != "exited" || list[x].Detail != want {
					t.Errorf("exec ls: %s is %+v, want exited, %q", x, list[x], want)
				}
			}
			if s := list[sleeper].Signal; s != "SIGKILL" {
				t.Errorf("exec ls: the killed exec's signal is %q", s)
			}
			if f := list[flood].Stdout; f.MaxBytes != "65536" || f.WrittenBytes != strconv.Itoa(written) || m == nil || f.DroppedBytes != m[1] {
				t.Errorf("exec ls: the flood's stdout counts %+v (marker %q)", f, m)
			}

			// The bound: 64 live at once, the 65th refused naming it.
			var pids []int
			for i := range 64 {
				x := d.detach(id, "sleep", "1000")
				if i == 0 {
					pids = append(pids, d.execs(id)[x].PID)
				}
			}
			res = d.ctl("exec", "-d", id, "--", "sleep", "1000")
			if res.code != 1 || !strings.Contains(res.stderr, "runs 64 detached execs, the most one session may at once") {
				t.Errorf("the 65th live detached exec: %+v", res)
			}
			for _, x := range d.execs(id) {
				if x.State == "running" && x.PID != pids[0] {
					pids = append(pids, x.PID)
				}
			}
			if len(pids) != 64 {
				t.Fatalf("exec ls lists %d running execs, want 64", len(pids))
			}
			// Kill 63 of them so the restart below loses only one.
			for xid, x := range d.execs(id) {
				if x.State == "running" && x.PID != pids[0] {
					d.ok("exec", "kill", id, xid)
				}
			}

			// roostd killed: the ended execs' records stay, the one running is lost, and
			// what is left of it is ended.
			d.kill9()
			d.start()
			if res := d.ctl("exec", "attach", "--from-start", id, counter); res.code != 3 || res.stdout != "1\n2\n3\n" {
				t.Errorf("attach --from-start after a restart: %+v", res)
			}
			var lost string
			for xid, x := range d.execs(id) {
				if x.PID == pids[0] {
					lost = xid
					if x.State != "lost" || x.ExitCode != nil || !strings.Contains(x.Detail, "roostd stopped while it ran") {
						t.Errorf("a detached exec running across a roostd kill -9: %+v", x)
					}
				}
			}
			if lost == "" {
				t.Fatalf("exec ls after the restart does not list the exec that ran (pid %d)", pids[0])
			}
			if res := d.ctl("exec", "wait", id, lost); res.code != 255 || !strings.Contains(res.stderr, "lost") {
				t.Errorf("exec wait of a lost exec: %+v", res)
			}
			awaitGone(t, pids[0])

			// rm -f of the session ends the detached execs it runs.
			last := d.detach(id, "sleep", "1000")
			pid := d.execs(id)[last].PID
			d.ok("rm", "-f", id)
			awaitGone(t, pid)
			if res := d.ctl("exec", "ls", id); res.code != 1 || !strings.Contains(res.stderr, id) {
				t.Errorf("exec ls of a removed session: %+v", res)
			}
		})
	}
}

// awaitGone waits for pid to be gone (or a zombie).
func awaitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !alive(pid) {
			return
		}
	}
	t.Errorf("pid %d is still running", pid)
}

// Bad input to the exec verbs is a usage error (125) or names what is wrong; a session's
// detached execs take their descriptors from its share of roostd's budget.
func TestExecDetachedRefusals(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "roostd.yaml")
	// Room for two detached execs (7 descriptors each), not three.
	if err := os.WriteFile(cfg, []byte("sessions:\n  descriptors_per_session: 20\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, "--config", cfg)
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "detachrefusals", "exec sleep 600", "")))
	defer d.ctl("kill", id)
	if res := d.ctl("exec", "-d", "-i", id, "--", "sleep", "1"); res.code != 125 || !strings.Contains(res.stderr, "exec -d takes no -i") {
		t.Errorf("exec -d -i: %+v", res)
	}
	if res := d.ctl("exec", "attach", id); res.code != 125 || !strings.Contains(res.stderr, "exec attach takes a SESSION and an EXEC_ID") {
		t.Errorf("exec attach without an EXEC_ID: %+v", res)
	}
	if res := d.ctl("exec", "wait", id, "../../etc"); res.code != 1 || !strings.Contains(res.stderr, `exec id "../../etc": want exec_ and 12 hex digits`) {
		t.Errorf("exec wait of a bad id: %+v", res)
	}
	// A session without detached execs lists none.
	if res := d.ctl("exec", "ls", id); res.code != 0 || res.stdout != "EXEC ID  STATE  STARTED  OUTPUT  COMMAND  DETAIL\n" {
		t.Errorf("exec ls of a session without detached execs: %+v", res)
	}
	if res := d.ctl("exec", "kill", id, "exec_000000000000"); res.code != 1 || !strings.Contains(res.stderr, "has no detached exec exec_000000000000") {
		t.Errorf("exec kill of an unknown exec: %+v", res)
	}
	if res := d.ctl("exec", "kill", "-s", "NOPE", id, "exec_000000000000"); res.code != 125 || !strings.Contains(res.stderr, `--signal: signal "NOPE"`) {
		t.Errorf("exec kill -s NOPE: %+v", res)
	}
	// A command that cannot start is said at once, as exec says it.
	if res := d.ctl("exec", "-d", id, "--", "nosuch-command"); res.code != 127 || res.stdout != "" || !strings.Contains(res.stderr, "nosuch-command") {
		t.Errorf("exec -d of a missing command: %+v", res)
	}

	d.detach(id, "sleep", "1000")
	second := d.detach(id, "sleep", "1000")
	if res := d.ctl("exec", "-d", id, "--", "sleep", "1000"); res.code != 1 || !strings.Contains(res.stderr, "descriptor budget: "+id+" holds its share of 20") {
		t.Errorf("a detached exec past the session's descriptor share: %+v", res)
	}
	// A slot given back is there for the next.
	d.ok("exec", "kill", id, second)
	d.detach(id, "sleep", "1000")
}

// A client of the API (as an SDK is) detaches an exec, reads part of its output, drops the
// stream, and re-attaches from the offset it reached: it gets the rest, once, then the exit.
func TestExecDetachedAPIResume(t *testing.T) {
	testenv.NeedRoot(t, "a scoped session")
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "detachapi", "exec sleep 600",
		"capabilities:\n  containment: scoped\n  shell:\n    allow: [sleep, sh]\n")))
	defer d.ctl("kill", id)
	conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := roostv1.NewSessionServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	stream, err := c.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := &roostv1.ExecStart{Id: id, Command: []string{"sh", "-c", "echo one; sleep 2; echo two; echo three; exit 4"}, Detach: true}
	if err := stream.Send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_Start{Start: start}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil || !resp.GetStarted().GetDetached() || resp.GetStarted().GetPid() == 0 {
		t.Fatalf("the detached exec's answer: %v, %v", resp, err)
	}
	execID := resp.GetStarted().GetExecId()
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the detached exec's stream goes on after ExecStarted: %v", err)
	}

	// Its first line, then the client goes.
	actx, acancel := context.WithCancel(ctx)
	att, err := c.AttachExec(actx, &roostv1.AttachExecRequest{Id: id, ExecId: execID, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	first, err := att.Recv()
	acancel()
	if err != nil || first.GetOutput().GetStream() != "stdout" || string(first.GetOutput().GetData()) != "one\n" || first.GetOutput().GetOffset() != 0 {
		t.Fatalf("the first output: %v, %v", first, err)
	}

	att, err = c.AttachExec(ctx, &roostv1.AttachExecRequest{Id: id, ExecId: execID, Follow: true, StdoutOffset: int64(len("one\n"))})
	if err != nil {
		t.Fatal(err)
	}
	var rest string
	var exit *roostv1.ExecExit
	for {
		resp, err := att.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if o := resp.GetOutput(); o != nil {
			rest += string(o.GetData())
		}
		if e := resp.GetExit(); e != nil {
			exit = e
		}
	}
	if rest != "two\nthree\n" || exit.GetExitCode() != 4 || exit.GetDetail() != "exited with code 4" {
		t.Fatalf("resumed at offset 4: %q, exit %v", rest, exit)
	}
	w, err := c.WaitExec(ctx, &roostv1.WaitExecRequest{Id: id, ExecId: execID})
	if err != nil || w.GetExec().GetState() != "exited" || w.GetExec().GetExitCode() != 4 || w.GetExec().GetStdout().GetWrittenBytes() != int64(len("one\ntwo\nthree\n")) {
		t.Fatalf("WaitExec: %v, %v", w, err)
	}
}
