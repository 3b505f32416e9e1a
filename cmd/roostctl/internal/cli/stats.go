package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// statsInterval is how often stats samples: docker stats' pace, and the workdir measurement
// roostd caches is at most two of them old.
const statsInterval = time.Second

// noStreamInterval is how far apart stats --no-stream's two samples are: long enough for a
// cgroup's CPU time (counted in microseconds) to give a rate, short enough for a script.
const noStreamInterval = 500 * time.Millisecond

func (a *app) statsCommand() *cobra.Command {
	var noStream, asJSON bool
	var format string
	cmd := &cobra.Command{
		Use:   "stats [SESSION...]",
		Short: "Show live resource use of sessions, refreshed every second",
		Long: `stats shows what live sessions use, as docker stats does: every live session, or the
SESSIONs given (a name, a short id, an id or a unique id prefix). It samples every second;
on a terminal it redraws one table in place, elsewhere it prints a new table each time.
--no-stream samples twice, 500 ms apart, prints the second and exits: its CPU % is the rate
between the two. Ctrl-C ends it (exit 0).

  SESSION      the session's name, else its short id (as ps shows it)
  CPU %        CPU time used between two samples, of one core (200% is two cores busy);
               "--" on a stream's first sample, which has nothing to compare with
  MEM / LIMIT  memory in use and its cgroup's ceiling (resources.cgroup_memory_bytes);
               MEM % is their ratio, "--" without a ceiling (advisory sessions have none)
  PIDS         processes and threads, and the cgroup's ceiling (resources.cgroup_pids_max)
  WORKDIR      what the workdir bound counts: the workdir, home, a scoped TMPDIR and the
               children's trees (resources.workdir_max_bytes); a few seconds old at most
  TOKENS       tokens charged to the session
  EGRESS       bytes its egress proxy carried, up / down (scoped and sealed sessions)

A session that ends while it is watched shows "exited" once, then drops off; given
SESSIONs, stats ends once all of them have. Usage comes from a session's cgroup: a session
without one (a WASM or unconfined one where cgroups are not delegated) shows "--".

--format json (or --json) prints one JSON object per session per sample, one a line:
id, name, capsule, state, cpu_percent (null on a stream's first sample), memory_bytes,
memory_limit_bytes, memory_percent (null without a ceiling), pids, pids_limit,
workdir_bytes, tokens, egress {bytes_up, bytes_down} when it carried anything, and read_at.
Numbers are JSON numbers (these objects are roostctl's, not protojson).`,
		Example: `  roostctl stats
  roostctl stats --no-stream build-1 ses_01j9
  roostctl stats --no-stream --format json | jq .memory_bytes`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if asJSON {
				if cmd.Flags().Changed("format") && format != "json" {
					return usageError{fmt.Errorf("--json and --format %q: give one (--json is --format json)", format)}
				}
				format = "json"
			}
			switch format {
			case "table", "json":
			default:
				return usageError{fmt.Errorf("--format %q: give table or json", format)}
			}
			c, err := a.sessions()
			if err != nil {
				return err
			}
			// Ctrl-C is how a watch ends: not a failure.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			w := &statsWatch{c: c, prev: map[string]cpuSample{}, seen: map[string]bool{}}
			if len(args) > 0 {
				if w.ids, err = resolveSessions(ctx, c, args); err != nil {
					return err
				}
				w.named = true
			}
			out := cmd.OutOrStdout()
			tty := format == "table" && !noStream && isTerminal(out)
			if noStream {
				err := w.prime(ctx)
				if ctx.Err() != nil {
					return nil
				}
				if err != nil {
					return err
				}
			}
			for {
				rows, err := w.sample(ctx)
				if ctx.Err() != nil {
					return nil
				}
				if err != nil {
					return err
				}
				if format == "json" {
					err = writeStatsJSON(out, rows)
				} else {
					err = writeStatsTable(out, rows, tty)
				}
				if err != nil || noStream || w.done() {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(statsInterval):
				}
			}
		},
	}
	cmd.Flags().BoolVar(&noStream, "no-stream", false, "print one sample (CPU % over 500 ms) and exit")
	cmd.Flags().StringVar(&format, "format", "table", "table, or json (one object per session per sample)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "same as --format json")
	return cmd
}

// resolveSessions asks roostd for each session named, as every command does (it resolves
// names, short ids and prefixes), and returns their ids, each once. Watching by id keeps
// a name given to a later session from being followed.
func resolveSessions(ctx context.Context, c roostv1.SessionServiceClient, args []string) ([]string, error) {
	var ids []string
	have := map[string]bool{}
	for _, arg := range args {
		resp, err := c.Get(ctx, &roostv1.GetRequest{Id: arg})
		if err != nil {
			return nil, err
		}
		if id := resp.GetSession().GetId(); !have[id] {
			have[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// cpuSample is a session's CPU time when it was read, for the next sample's CPU %.
type cpuSample struct {
	seconds float64
	at      time.Time
}

// statsWatch samples sessions over time: every live one, or ids.
type statsWatch struct {
	c roostv1.SessionServiceClient
	// named is whether SESSIONs were given; ids are those not ended yet, and stats ends once
	// there are none.
	named bool
	ids   []string
	// prev is each session's last CPU reading; seen the sessions of the last sample of every
	// live session, so that one that has left the live list is shown once as it ended.
	prev map[string]cpuSample
	seen map[string]bool
}

// statsRow is one session in one sample; its JSON form is stats --format json's.
type statsRow struct {
	ID               string      `json:"id"`
	Name             string      `json:"name,omitempty"`
	Capsule          string      `json:"capsule"`
	State            string      `json:"state"`
	CPUPercent       *float64    `json:"cpu_percent"`
	MemoryBytes      int64       `json:"memory_bytes"`
	MemoryLimitBytes int64       `json:"memory_limit_bytes"`
	MemoryPercent    *float64    `json:"memory_percent"`
	Pids             int64       `json:"pids"`
	PidsLimit        int64       `json:"pids_limit"`
	WorkdirBytes     int64       `json:"workdir_bytes"`
	Tokens           int64       `json:"tokens"`
	Egress           *statsBytes `json:"egress,omitempty"`
	ReadAt           time.Time   `json:"read_at"`
	// usage is whether the session's usage could be read at all.
	usage bool
}

type statsBytes struct {
	BytesUp   int64 `json:"bytes_up"`
	BytesDown int64 `json:"bytes_down"`
}

func (w *statsWatch) done() bool { return w.named && len(w.ids) == 0 }

// sample reads every watched session once.
func (w *statsWatch) sample(ctx context.Context) ([]statsRow, error) {
	var list []*roostv1.Session
	if w.named {
		var keep []string
		for _, id := range w.ids {
			resp, err := w.c.Get(ctx, &roostv1.GetRequest{Id: id})
			if status.Code(err) == codes.NotFound {
				// Removed (rm, prune, retention) since the last sample.
				continue
			}
			if err != nil {
				return nil, err
			}
			s := resp.GetSession()
			list = append(list, s)
			// An ended one is shown this once.
			if s.GetState() != "exited" {
				keep = append(keep, id)
			}
		}
		w.ids = keep
		return w.rows(list), nil
	}
	resp, err := w.c.List(ctx, &roostv1.ListRequest{})
	if err != nil {
		return nil, err
	}
	now := map[string]bool{}
	for _, s := range resp.GetSessions() {
		if s.GetState() == "staged" || s.GetState() == "exited" {
			continue
		}
		now[s.GetId()] = true
		list = append(list, s)
	}
	// Those live at the last sample and not now have ended (or were staged and launched
	// meanwhile and gone already): each is shown once, as it stands.
	for id := range w.seen {
		if now[id] {
			continue
		}
		resp, err := w.c.Get(ctx, &roostv1.GetRequest{Id: id})
		if err == nil {
			list = append(list, resp.GetSession())
		}
		delete(w.prev, id)
	}
	w.seen = now
	return w.rows(list), nil
}

// prime takes a sample that is not shown, then waits noStreamInterval, so that the next
// sample has a CPU reading to compare with: stats --no-stream's CPU % is then the rate
// over that interval, as docker stats --no-stream's is over its own two samples. The watch
// is left as it was but for the readings: a named session that has ended is still shown.
func (w *statsWatch) prime(ctx context.Context) error {
	first := &statsWatch{c: w.c, named: w.named, ids: w.ids, prev: w.prev, seen: map[string]bool{}}
	if _, err := first.sample(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(noStreamInterval):
	}
	return nil
}

// rows turns sessions into rows, computing CPU % from each one's previous reading.
func (w *statsWatch) rows(list []*roostv1.Session) []statsRow {
	at := time.Now()
	rows := make([]statsRow, 0, len(list))
	for _, s := range list {
		r := statsRow{
			ID: s.GetId(), Name: s.GetName(), Capsule: s.GetCapsule().GetName() + "@" + s.GetCapsule().GetVersion(),
			State: s.GetState(), Tokens: s.GetSpend().GetTokens(), ReadAt: at.UTC(),
		}
		if e := s.GetEgress(); e != nil {
			r.Egress = &statsBytes{BytesUp: e.GetBytesUp(), BytesDown: e.GetBytesDown()}
		}
		if u := s.GetUsage(); u != nil && s.GetState() != "exited" {
			r.usage = true
			r.MemoryBytes, r.MemoryLimitBytes = u.GetMemoryBytes(), u.GetMemoryLimitBytes()
			r.Pids, r.PidsLimit, r.WorkdirBytes = u.GetPids(), u.GetPidsLimit(), u.GetWorkdirBytes()
			if r.MemoryLimitBytes > 0 {
				p := 100 * float64(r.MemoryBytes) / float64(r.MemoryLimitBytes)
				r.MemoryPercent = &p
			}
			if prev, ok := w.prev[s.GetId()]; ok && at.After(prev.at) {
				// A counter that went back (a session re-attached with a new cgroup reading)
				// has no rate: shown as 0 rather than negative.
				p := max(0, 100*(u.GetCpuSeconds()-prev.seconds)/at.Sub(prev.at).Seconds())
				r.CPUPercent = &p
			}
			w.prev[s.GetId()] = cpuSample{seconds: u.GetCpuSeconds(), at: at}
		}
		if s.GetState() == "exited" {
			delete(w.prev, s.GetId())
		}
		rows = append(rows, r)
	}
	return rows
}

func writeStatsJSON(w io.Writer, rows []statsRow) error {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// writeStatsTable prints one sample as a table. On a terminal it redraws the screen from
// its top, each line erased to its end and the rest of the screen below the table too, so
// nothing of a longer earlier table stays and nothing flickers; elsewhere each table
// follows the last, a blank line between them.
func writeStatsTable(w io.Writer, rows []statsRow, tty bool) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tCAPSULE\tCPU %\tMEM / LIMIT\tMEM %\tPIDS\tWORKDIR\tTOKENS\tEGRESS")
	sessions := make([]*roostv1.Session, len(rows))
	for i, r := range rows {
		sessions[i] = &roostv1.Session{Id: r.ID}
	}
	shorts := shortIDs(sessions)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(statsCells(r, shorts[r.ID]), "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !tty {
		buf.WriteByte('\n')
		_, err := w.Write(buf.Bytes())
		return err
	}
	var screen strings.Builder
	screen.WriteString(cursorTop)
	for line := range strings.Lines(buf.String()) {
		screen.WriteString(strings.TrimSuffix(line, "\n") + eraseLine + "\n")
	}
	screen.WriteString(eraseDown)
	_, err := io.WriteString(w, screen.String())
	return err
}

// statsCells are a row's table cells.
func statsCells(r statsRow, short string) []string {
	name := r.Name
	if name == "" {
		name = short
	}
	egress := "--"
	if r.Egress != nil {
		egress = bytesIEC(r.Egress.BytesUp) + " / " + bytesIEC(r.Egress.BytesDown)
	}
	tokens := fmt.Sprint(r.Tokens)
	switch {
	case r.State == "exited":
		return []string{name, r.Capsule, "exited", "--", "--", "--", "--", tokens, egress}
	case !r.usage:
		return []string{name, r.Capsule, orDash(stateUnlessRunning(r.State)), "--", "--", "--", "--", tokens, egress}
	}
	cpu := "--"
	if r.CPUPercent != nil {
		cpu = fmt.Sprintf("%.2f%%", *r.CPUPercent)
	}
	mem := bytesIEC(r.MemoryBytes) + " / "
	memPct := "--"
	if r.MemoryLimitBytes > 0 {
		mem += bytesIEC(r.MemoryLimitBytes)
		memPct = fmt.Sprintf("%.2f%%", *r.MemoryPercent)
	} else {
		mem += "--"
	}
	pids := fmt.Sprint(r.Pids)
	if r.PidsLimit > 0 {
		pids += fmt.Sprintf(" / %d", r.PidsLimit)
	}
	if r.State == "paused" {
		cpu = "paused"
	}
	return []string{name, r.Capsule, cpu, mem, memPct, pids, bytesIEC(r.WorkdirBytes), tokens, egress}
}

// stateUnlessRunning names a state worth saying in the CPU column: a session launching or
// stopping has no usage to show yet, or any more.
func stateUnlessRunning(state string) string {
	if state == "running" {
		return ""
	}
	return state
}
