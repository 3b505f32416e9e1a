package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/cmd/roostctl/internal/termtext"
	"roost.dev/roost/pkg/manifest"
)

// jsonOptions give proto field names (snake_case) and keep zero values, so every key a
// script matches on is present.
var jsonOptions = protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}

func marshal(m proto.Message) (json.RawMessage, error) {
	data, err := jsonOptions.Marshal(m)
	if err != nil {
		return nil, err
	}
	// protojson varies its whitespace on purpose; compact it for a stable form.
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// printJSON writes one message, indented.
func printJSON(w io.Writer, m proto.Message) error {
	data, err := marshal(m)
	if err != nil {
		return err
	}
	return writeIndented(w, data)
}

// printJSONList writes messages as one indented JSON array.
func printJSONList[T proto.Message](w io.Writer, items []T) error {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, it := range items {
		data, err := marshal(it)
		if err != nil {
			return err
		}
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(data)
	}
	buf.WriteByte(']')
	return writeIndented(w, buf.Bytes())
}

// printJSONLine writes one message as a single line.
func printJSONLine(w io.Writer, m proto.Message) error {
	data, err := marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", data)
	return err
}

func writeIndented(w io.Writer, data []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, data, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// sessionExitCode is what run and wait exit with for an ended session: the capsule's own
// exit code, 124 when its deadline ended it, 125 when it never started, 255 when how it
// ended is unknown.
func sessionExitCode(s *roostv1.Session) int {
	switch s.GetExitStatus() {
	case "deadline_reached":
		return exitDeadline
	case "start_failed":
		return exitNoLaunch
	case "lost", "":
		return exitLost
	}
	if s.ExitCode == nil {
		return exitLost
	}
	return int(s.GetExitCode())
}

// outcome says in a few words how a session stands.
func outcome(s *roostv1.Session) string {
	switch {
	case s.GetState() != "exited":
		return s.GetState()
	case s.ExitCode != nil:
		return fmt.Sprintf("%s (%d)", s.GetExitStatus(), s.GetExitCode())
	default:
		return s.GetExitStatus()
	}
}

func ago(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	d := time.Since(ts.AsTime())
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd ago", int(d.Hours()/24))
	}
}

func stamp(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().Local().Format(time.RFC3339)
}

// printSession writes one session for a person to read.
func printSession(w io.Writer, s *roostv1.Session) {
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-13s %s\n", k+":", v)
		}
	}
	row("id", s.GetId())
	row("name", s.GetName())
	for i, l := range labelPairs(s.GetLabels()) {
		if i == 0 {
			row("labels", l)
		} else {
			fmt.Fprintf(w, "%-13s %s\n", "", l)
		}
	}
	row("capsule", s.GetCapsule().GetName()+"@"+s.GetCapsule().GetVersion())
	row("sha256", strings.TrimPrefix(s.GetCapsule().GetSha256(), "sha256:"))
	row("source", s.GetCapsule().GetSource())
	if d := s.GetCapsule().GetDir(); d != s.GetCapsule().GetSource() {
		row("stored", d)
	}
	row("node", s.GetNode())
	if p := s.GetPlacement(); p != nil {
		row("placed", fmt.Sprintf("on %s by %s at %s: %s", p.GetNode(), p.GetEntry(), p.GetAt().AsTime().Local().Format(time.RFC3339), p.GetReason()))
		for _, c := range p.GetCandidates() {
			what := fmt.Sprintf("score %.2f: %d running, %d in flight", c.GetScore(), c.GetRunning(), c.GetInFlight())
			if c.GetMax() > 0 {
				what += fmt.Sprintf(", of %d", c.GetMax())
			}
			if c.GetWarm() {
				what += ", warm"
			}
			switch {
			case c.GetRefused() != "":
				what = "not a candidate: " + c.GetRefused()
			case c.GetNode() == p.GetNode():
				what += " (chosen)"
			case c.GetDrawn():
				what += " (drawn)"
			}
			fmt.Fprintf(w, "%-13s %s: %s\n", "", c.GetNode(), what)
		}
	}
	row("state", s.GetState())
	if s.GetState() == "exited" {
		row("exit status", s.GetExitStatus())
		if s.ExitCode != nil {
			row("exit code", fmt.Sprint(s.GetExitCode()))
		}
	}
	row("detail", s.GetDetail())
	row("containment", fmt.Sprintf("declared %s, achieved %s", s.GetContainment().GetDeclared(), orDash(s.GetContainment().GetAchieved())))
	row("runs as", identity(s.GetIdentity(), s.GetContainment().GetAchieved()))
	if s.GetWarm() {
		row("start", "warm: in a sandbox roostd made ahead (roostd --warm-pool)")
	}
	row("parent", s.GetParentId())
	row("command", shellJoin(s.GetCommand()))
	if s.GetPid() != 0 {
		row("pid", fmt.Sprint(s.GetPid()))
	}
	row("workdir", s.GetWorkdir())
	row("records", s.GetRecordsDir())
	row("created", stamp(s.GetCreatedAt()))
	if s.GetStartedAt() != nil {
		row("started", stamp(s.GetStartedAt()))
	}
	if n := s.GetMemoryLimitBytes(); n > 0 {
		how := "cgroup memory.max, no swap"
		if c := s.GetContainment().GetAchieved(); c != "sealed" && c != "scoped" {
			how = "recorded, not enforced under " + orDash(c)
		}
		row("memory limit", fmt.Sprintf("%s (%d bytes; %s)", manifest.FormatSize(n), n, how))
	}
	if s.GetDeadlineAt() != nil && s.GetState() != "exited" {
		row("deadline", stamp(s.GetDeadlineAt()))
	}
	if s.GetEndedAt() != nil {
		row("ended", stamp(s.GetEndedAt()))
	}
	row("tokens", fmt.Sprint(s.GetSpend().GetTokens()))
	row("stdout", logStats(s.GetStdout()))
	row("stderr", logStats(s.GetStderr()))
	if w := s.GetWasm(); w != nil {
		row("wasm", fmt.Sprintf("%s (sha256 %s) in roost-wasm, %s", w.GetModule(), w.GetSha256(), w.GetRuntime()))
	}
	if x := s.GetExecRefused(); x != nil {
		out := fmt.Sprintf("%d refused by the exec allowlist", x.GetCount())
		if p := x.GetRecentPaths(); len(p) > 0 {
			out += ", the newest: " + strings.Join(p, ", ")
		}
		row("execs", out+" (roostctl events, trace.jsonl)")
	}
	if e := s.GetEgress(); e != nil {
		out := fmt.Sprintf("%d connection(s), %d denied; %s up, %s down", e.GetConnections(), e.GetDenied(), bytesIEC(e.GetBytesUp()), bytesIEC(e.GetBytesDown()))
		if e.GetActive() > 0 {
			out += fmt.Sprintf("; %d open", e.GetActive())
		}
		if u := e.GetUsedBytes(); u > 0 {
			out += fmt.Sprintf("; %s counted against egress_max_bytes", bytesIEC(u))
		}
		row("egress", out)
		refused := e.GetRefused()
		for i, r := range refused[:min(len(refused), refusedShown)] {
			if i == 0 {
				row("refused", egressRefusal(r))
			} else {
				fmt.Fprintf(w, "%-13s %s\n", "", egressRefusal(r))
			}
		}
		if len(refused) > refusedShown {
			fmt.Fprintf(w, "%-13s … %d more (inspect --json)\n", "", len(refused)-refusedShown)
		}
	}
	if u := s.GetUsage(); u != nil {
		row("memory", fmt.Sprintf("%s (peak %s)", bytesIEC(u.GetMemoryBytes()), bytesIEC(u.GetMemoryPeakBytes())))
		row("cpu", fmt.Sprintf("%.2fs", u.GetCpuSeconds()))
		row("pids", fmt.Sprint(u.GetPids()))
	}
}

// refusedShown is how many refusal keys inspect lists (--json has every one the record keeps).
const refusedShown = 5

// egressRefusal is one refusal key as inspect lists it.
func egressRefusal(r *roostv1.EgressRefusal) string {
	host := r.GetHost()
	if host == "*" {
		host = "other hosts"
	} else if r.GetPort() > 0 {
		host = net.JoinHostPort(host, strconv.Itoa(int(r.GetPort())))
	}
	out := fmt.Sprintf("%d× %s: %s", r.GetCount(), host, r.GetReason())
	if l := r.GetLast(); l != nil {
		out += ", last " + l.AsTime().Local().Format(time.RFC3339)
	}
	return out
}

// logStats says what the records kept of one output stream; empty when it is not known.
func logStats(l *roostv1.LogStats) string {
	if l == nil {
		return ""
	}
	out := bytesIEC(l.GetWrittenBytes()) + " written"
	if cut := l.GetDroppedBytes() - l.GetFailedBytes(); cut > 0 {
		out += fmt.Sprintf(", %s dropped past resources.log_max_bytes (%s; its first and newest bytes are kept)", bytesIEC(cut), bytesIEC(l.GetMaxBytes()))
	}
	if l.GetFailedBytes() > 0 {
		out += fmt.Sprintf(", %s lost to failed writes", bytesIEC(l.GetFailedBytes()))
	}
	return out
}

// identity says who a session's processes are on the host.
func identity(id *roostv1.Identity, class string) string {
	switch {
	case id == nil:
		return ""
	case id.GetHostRoot():
		return "host root (roostd's sessions.allow_root names the capsule)"
	case class == "sealed":
		return fmt.Sprintf("root in a user namespace: ids 0-%d inside are host uids %d-%d", id.GetSize()-1, id.GetUid(), id.GetUid()+id.GetSize()-1)
	}
	return fmt.Sprintf("uid %d, gid %d (its own; the session holds %d-%d)", id.GetUid(), id.GetGid(), id.GetUid(), id.GetUid()+id.GetSize()-1)
}

func bytesIEC(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shellJoin writes argv as a shell would need it typed, on one line: an argument with a
// space, quote or control character in it is quoted, newlines as \n, so a multi-line
// script keeps inspect's columns.
func shellJoin(argv []string) string {
	out := make([]string, len(argv))
	for i, arg := range argv {
		plain := arg != ""
		for _, r := range arg {
			if !(r == '/' || r == '.' || r == '-' || r == '_' || r == '=' || r == ':' || r == ',' || r == '+' || r == '@' || r == '%' ||
				('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9')) {
				plain = false
				break
			}
		}
		switch {
		case plain:
			out[i] = arg
		case strings.ContainsFunc(arg, func(r rune) bool { return r < ' ' || r == 0x7f }):
			// bash's $'…' reads the escapes strconv.Quote writes, but for the quotes.
			q := strconv.Quote(arg)
			q = strings.ReplaceAll(q[1:len(q)-1], `\"`, `"`)
			out[i] = "$'" + strings.ReplaceAll(q, "'", `\'`) + "'"
		default:
			out[i] = "'" + strings.ReplaceAll(arg, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}

// sessionOutput is where a session's bytes for w go: on a terminal, unless raw, through an
// escaper, since what a session prints is not the operator's to run on their terminal
// (package termtext says what is escaped). Anywhere else (a pipe, a file) they go as they
// are, byte for byte. flush writes what the escaper still holds at the stream's end.
func sessionOutput(w io.Writer, raw bool) (out io.Writer, flush func() error) {
	if f, ok := w.(*os.File); ok && !raw && term.IsTerminal(int(f.Fd())) {
		e := termtext.NewWriter(w)
		return e, e.Flush
	}
	return w, func() error { return nil }
}
