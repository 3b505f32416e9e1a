package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// eventsFilterKeys are the keys events --filter knows.
var eventsFilterKeys = []string{"label", "session", "type"}

// eventFilter is what events --filter, --since T and --until select.
type eventFilter struct {
	// types are patterns (path.Match) an event's type must match one of; nil: any.
	types []string
	// sessions are the ids an event's session must be one of; nil: any.
	sessions []string
	// labels are label selectors an event's session must match every one of; nil: any.
	labels []string
	// labelled says whether a session's labels match, once per session (sessionLabels).
	labelled func(id string) (bool, error)
	// since, when set, is the first moment whose events are printed.
	since time.Time
	// until, when set, is the last moment whose events are printed.
	until time.Time
}

func (f *eventFilter) match(ev *roostv1.Event) (bool, error) {
	if !f.since.IsZero() && ev.GetTime().AsTime().Before(f.since) {
		return false, nil
	}
	if f.types != nil && !matchAny(f.types, ev.GetType()) {
		return false, nil
	}
	if f.sessions != nil && !containsString(f.sessions, ev.GetSessionId()) {
		return false, nil
	}
	if f.labels != nil {
		if ev.GetSessionId() == "" {
			return false, nil
		}
		return f.labelled(ev.GetSessionId())
	}
	return true, nil
}

// sessionLabels is eventFilter.labelled: it asks roostd once for the sessions whose labels
// match (List, which also checks the selectors), then once for each other session an event
// names (Get: sessions staged since, or that did not match), and remembers the answer.
// Events carry no labels, and a removed session's went with its record: its events never
// match.
func sessionLabels(ctx context.Context, c roostv1.SessionServiceClient, selectors []string) (func(id string) (bool, error), error) {
	resp, err := c.List(ctx, &roostv1.ListRequest{All: true, Label: selectors})
	if err != nil {
		if status.Code(err) == codes.InvalidArgument {
			return nil, usageError{fmt.Errorf("--filter: %s", status.Convert(err).Message())}
		}
		return nil, err
	}
	known := map[string]bool{}
	for _, s := range resp.GetSessions() {
		known[s.GetId()] = true
	}
	return func(id string) (bool, error) {
		if ok, seen := known[id]; seen {
			return ok, nil
		}
		resp, err := c.Get(ctx, &roostv1.GetRequest{Id: id})
		switch {
		case status.Code(err) == codes.NotFound:
			known[id] = false
		case err != nil:
			return false, err
		default:
			known[id] = labelSelected(resp.GetSession().GetLabels(), selectors)
		}
		return known[id], nil
	}, nil
}

// after reports whether ev is past --until: events come in commit order, which is time
// order, so the first one past it ends the listing.
func (f *eventFilter) after(ev *roostv1.Event) bool {
	return !f.until.IsZero() && ev.GetTime().AsTime().After(f.until)
}

func matchAny(patterns []string, s string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, s); ok {
			return true
		}
	}
	return false
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// errUntil ends a stream at --until.
var errUntil = errors.New("--until reached")

// eventWidths are the table's fixed column widths. Fixed, not measured, so that a follower
// prints each event as it comes and still lines up: SEQ up to 8 digits, TIME RFC3339 with
// an offset, TYPE the longest roostd emits (session.launching), SESSION a short id.
var eventWidths = []int{8, 25, 17, 12}

// eventRow is one event's cells for the table.
func eventRow(ev *roostv1.Event, noTrunc bool) []string {
	what := ev.GetExitStatus()
	if ev.ExitCode != nil {
		what = fmt.Sprintf("%s (%d)", what, ev.GetExitCode())
	}
	if what == "" {
		what = ev.GetDetail()
	}
	id := ev.GetSessionId()
	switch {
	case id == "":
		id = "-"
	case !noTrunc:
		id = shortID(id, shortIDLen)
	}
	return []string{strconv.FormatUint(ev.GetSeq(), 10), ev.GetTime().AsTime().Local().Format(time.RFC3339), ev.GetType(), id, what}
}

// printEventRow writes cells in columns of widths (a cell wider than its column pushes the
// rest of its line along, by two spaces at least), and no trailing spaces.
func printEventRow(w io.Writer, cells []string, widths []int) error {
	var line strings.Builder
	for i, cell := range cells {
		line.WriteString(cell)
		if i < len(cells)-1 {
			pad := 2
			if i < len(widths) {
				pad = max(widths[i]-len(cell), 0) + 2
			}
			line.WriteString(strings.Repeat(" ", pad))
		}
	}
	_, err := fmt.Fprintln(w, strings.TrimRight(line.String(), " "))
	return err
}

// streamEvents hands emit the events after sequence number since that f selects until the stream ends
// (or passes f.until), keeping last current.
func (a *app) streamEvents(ctx context.Context, c roostv1.SessionServiceClient, node string, since uint64, fromOldest, follow bool, f *eventFilter, emit func(*roostv1.Event) error, last *uint64, opts ...grpc.CallOption) error {
	// Without a sequence number, from whatever the log still keeps; --after-seq 0 asks for
	// everything, and roostd says so when retention has compacted the start away.
	stream, err := c.Events(ctx, &roostv1.EventsRequest{Since: since, Follow: follow, FromOldestKept: since == 0 && fromOldest, Node: node}, opts...)
	if err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		ev := resp.GetEvent()
		if f.after(ev) {
			return errUntil
		}
		ok, err := f.match(ev)
		if err != nil {
			return err
		}
		*last = ev.GetSeq()
		if !ok {
			continue
		}
		if err := emit(ev); err != nil {
			return err
		}
	}
}

// parseUntil reads --until, where a negative duration (--until=-10m) means from now on.
func parseUntil(s string, now time.Time) (time.Time, error) {
	return parseTimeFlag("--until", s, now, true)
}

func (a *app) eventsCommand() *cobra.Command {
	var afterSeq uint64
	var follow, asJSON, noTrunc bool
	var since, until string
	var filters, fleetAfter []string
	var fleetWide bool
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print the registry's events",
		Long: `events prints every registry event, oldest first, and exits; --follow keeps printing
new events as they happen. Sequence numbers survive daemon restarts, so
"events --after-seq N --follow" resumes exactly after event N; a follower that loses roostd
(a restart, a crash) waits for it and resumes after the last event it printed, so it sees
every event exactly once.

--since T prints only events at or after T, --until T none after T. T is a time (RFC 3339:
2006-01-02T15:04:05Z07:00, or 2006-01-02T15:04:05 and 2006-01-02 in local time), Unix
seconds with a fraction (1700000000.0), or a duration before now (10m is ten minutes ago;
--until=-10m is ten minutes from now). A plain integer given to --since is a sequence
number, as for --after-seq, so scripts that resume with --since N keep working: Unix
seconds need their fraction there (--until takes them either way). With --follow, events
stops when the clock reaches --until.

--filter KEY=VALUE selects events; give it more than once, or comma-separated. Filters on
one key widen the selection, on different keys narrow it:
  type=PATTERN      the event's type, as a shell pattern: session.exited, session.*
  session=SESSION   one session's events; a name, short id or id prefix is resolved once,
                    when events starts (a removed session only by its full id)
  label=KEY=VALUE   the events of sessions whose label KEY has VALUE (run|stage --label);
                    label=KEY: that have the label KEY. Label filters narrow each (every
                    one must match). A removed session's labels are gone with its record:
                    its events are not selected

The table shows short session ids (--no-trunc: full ones). With --json it prints one JSON
object per line, each with its "seq".

--fleet, on a fleet node, prints the events of every node of the fleet's directory, merged
as they come, each with its node (a NODE column; "node" in JSON): each node numbers its own,
so a fleet's events are keyed by node and seq, and --fleet-after NODE=SEQ (repeatable)
resumes a node after its event SEQ. A follower outlives the entry node's restart and any
node's: it resumes each node after the last event it printed of it.`,
		Example: `  roostctl events --since 10m                   # the last ten minutes
  roostctl events --since 2025-05-01 --until 2025-05-02 --filter type=session.exited
  roostctl events --filter session=build-1,type=session.running --json
  roostctl events --follow --filter label=team=a --filter type=session.exited
  roostctl events --after-seq 1234 --follow --json   # resume after event 1234
  roostctl events --follow --until=-5m          # what happens in the next five minutes
  roostctl events --fleet --follow --json       # every node's, as they happen
  roostctl events --fleet --fleet-after node-a=120 --fleet-after node-b=88`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := &eventFilter{}
			var refs []string
			for _, arg := range filters {
				for kv := range strings.SplitSeq(arg, ",") {
					key, value, ok := strings.Cut(kv, "=")
					if !ok || value == "" {
						return usageError{fmt.Errorf("--filter %q: give KEY=VALUE, KEY one of %s", kv, strings.Join(eventsFilterKeys, ", "))}
					}
					switch key {
					case "type":
						if _, err := path.Match(value, ""); err != nil {
							return usageError{fmt.Errorf("--filter type=%s: not a pattern: %v", value, err)}
						}
						f.types = append(f.types, value)
					case "session":
						refs = append(refs, value)
					case "label":
						f.labels = append(f.labels, value)
					default:
						return usageError{fmt.Errorf("--filter %q: unknown key %q; the keys are %s", kv, key, strings.Join(eventsFilterKeys, ", "))}
					}
				}
			}
			now := time.Now()
			seqGiven := cmd.Flags().Changed("after-seq")
			if since != "" {
				seq, t, err := parseEventsSince(since, now)
				if err != nil {
					return err
				}
				if t.IsZero() {
					if seqGiven {
						return usageError{fmt.Errorf("--since %s and --after-seq %d: both are sequence numbers; give one", since, afterSeq)}
					}
					afterSeq, seqGiven = seq, true
				}
				f.since = t
			}
			if until != "" {
				t, err := parseUntil(until, now)
				if err != nil {
					return err
				}
				f.until = t
			}
			if fleetWide && (seqGiven || f.labels != nil) {
				return usageError{errors.New("--fleet: each node numbers its own events, so resume with --fleet-after NODE=SEQ, not --after-seq or --since N; and label filters read one node's records, not the fleet's")}
			}
			if !fleetWide && len(fleetAfter) > 0 {
				return usageError{errors.New("--fleet-after: only with --fleet")}
			}
			c, err := a.sessions()
			if err != nil {
				return err
			}
			for _, ref := range refs {
				id, err := resolveForEvents(cmd.Context(), c, ref)
				if err != nil {
					return err
				}
				f.sessions = append(f.sessions, id)
			}
			if f.labels != nil {
				if f.labelled, err = sessionLabels(cmd.Context(), c, f.labels); err != nil {
					return err
				}
			}
			ctx := cmd.Context()
			var reached atomic.Bool
			if follow && !f.until.IsZero() {
				if !f.until.After(time.Now()) {
					// Every event still to come is after --until: there is nothing to follow.
					follow = false
				} else {
					// A follower stops when the clock reaches --until, event or no event. By
					// a cancel of its own, not a context deadline: that would travel to
					// roostd as the call's timeout, and roostd's end of the stream may come
					// back before roostctl's own timer has fired.
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					defer cancel()
					timer := time.AfterFunc(time.Until(f.until), func() {
						reached.Store(true)
						cancel()
					})
					defer timer.Stop()
				}
			}
			out := cmd.OutOrStdout()
			// The header goes out with the first row, or at the end of a listing with none:
			// a refused listing (events compacted away) prints nothing on stdout.
			headed := asJSON
			header := func() error {
				if headed {
					return nil
				}
				headed = true
				return printEventRow(out, []string{"SEQ", "TIME", "TYPE", "SESSION", "DETAIL"}, eventWidths)
			}
			emit := func(ev *roostv1.Event) error {
				if asJSON {
					return printJSONLine(out, ev)
				}
				if err := header(); err != nil {
					return err
				}
				return printEventRow(out, eventRow(ev, noTrunc), eventWidths)
			}
			if fleetWide {
				return a.fleetEvents(ctx, cmd, c, fleetAfter, follow, f, asJSON, noTrunc, &reached)
			}
			last := afterSeq
			var opts []grpc.CallOption
			for {
				err := a.streamEvents(ctx, c, "", last, !seqGiven, follow, f, emit, &last, opts...)
				switch {
				case err == nil, errors.Is(err, errUntil):
					return header()
				case reached.Load():
					// The clock reached --until.
					return header()
				case !follow || status.Code(err) != codes.Unavailable:
					return err
				}
				// roostd went away (a restart, a crash): the registry keeps every event, so
				// resuming after the last one seen loses none and repeats none.
				fmt.Fprintf(cmd.ErrOrStderr(), "roostctl: lost roostd (%s); resuming after event %d once it is back\n", status.Convert(err).Message(), last)
				opts = []grpc.CallOption{grpc.WaitForReady(true)}
			}
		},
	}
	cmd.Flags().StringVar(&since, "since", "", "print events at or after time `T` (RFC 3339, Unix seconds with a fraction, or a duration before now); a plain integer is a sequence number, as --after-seq")
	cmd.Flags().Uint64Var(&afterSeq, "after-seq", 0, "print events after sequence number `N` (0: every event, failing if some were compacted away)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing events as they happen")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line")
	cmd.Flags().StringArrayVar(&filters, "filter", nil, "select events by `KEY=VALUE` (repeatable, comma-separated); keys: "+strings.Join(eventsFilterKeys, ", "))
	cmd.Flags().StringVar(&until, "until", "", "stop at time `T`: RFC 3339, Unix seconds, or a duration before now (-10m: from now)")
	cmd.Flags().BoolVar(&noTrunc, "no-trunc", false, "show full session ids")
	cmd.Flags().BoolVar(&fleetWide, "fleet", false, "print the events of every node of the fleet, merged, each with its node")
	cmd.Flags().StringArrayVar(&fleetAfter, "fleet-after", nil, "with --fleet: resume node `NODE=SEQ` after its event SEQ (repeatable)")
	return cmd
}

// fleetEventWidths are the fleet table's: NODE first, then the columns of eventWidths.
var fleetEventWidths = append([]int{10}, eventWidths...)

// fleetEvents is events --fleet: one stream per node of the directory, each routed to its
// node through the entry node, merged as events come. A stream that loses its node or the
// entry node resumes after the last event it printed of that node, when following; without
// --follow, a node that cannot be read is said, the others printed, and the exit is 1.
func (a *app) fleetEvents(ctx context.Context, cmd *cobra.Command, c roostv1.SessionServiceClient, after []string, follow bool, f *eventFilter, asJSON, noTrunc bool, reached *atomic.Bool) error {
	from := map[string]uint64{}
	for _, arg := range after {
		node, seq, ok := strings.Cut(arg, "=")
		n, err := strconv.ParseUint(seq, 10, 64)
		if !ok || node == "" || err != nil {
			return usageError{fmt.Errorf("--fleet-after %q: give NODE=SEQ, SEQ an event's sequence number on that node", arg)}
		}
		from[node] = n
	}
	conn, err := a.connect()
	if err != nil {
		return err
	}
	resp, err := roostv1.NewSpendServiceClient(conn).ListFleetNodes(ctx, &roostv1.ListFleetNodesRequest{})
	if err != nil {
		return err
	}
	var nodes []string
	for _, n := range resp.GetDirectory() {
		nodes = append(nodes, n.GetNode())
	}
	for node := range from {
		if !slices.Contains(nodes, node) {
			return usageError{fmt.Errorf("--fleet-after %s=%d: no node %q in the fleet's directory (roostctl fleet nodes lists them)", node, from[node], node)}
		}
	}
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	var mu sync.Mutex
	headed := asJSON
	header := func() error {
		if headed {
			return nil
		}
		headed = true
		return printEventRow(out, []string{"NODE", "SEQ", "TIME", "TYPE", "SESSION", "DETAIL"}, fleetEventWidths)
	}
	emit := func(ev *roostv1.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if asJSON {
			return printJSONLine(out, ev)
		}
		if err := header(); err != nil {
			return err
		}
		return printEventRow(out, append([]string{ev.GetNode()}, eventRow(ev, noTrunc)...), fleetEventWidths)
	}
	note := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(errOut, format, args...)
	}
	var failed []string
	var wg sync.WaitGroup
	for _, node := range nodes {
		wg.Go(func() {
			last, given := from[node]
			opts := []grpc.CallOption{}
			for {
				err := a.streamEvents(ctx, c, node, last, !given, follow, f, emit, &last, opts...)
				given = given || last > 0
				switch {
				case err == nil, errors.Is(err, errUntil), reached.Load(), ctx.Err() != nil:
					return
				case !follow:
					note("roostctl: node %s: %s\n", node, status.Convert(err).Message())
					mu.Lock()
					failed = append(failed, node)
					mu.Unlock()
					return
				}
				// The entry node or this node went away: every node keeps its events, so
				// resuming after the last one printed of it loses none and repeats none.
				note("roostctl: node %s: %s; resuming after its event %d\n", node, status.Convert(err).Message(), last)
				opts = []grpc.CallOption{grpc.WaitForReady(true)}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
		})
	}
	wg.Wait()
	if err := header(); err != nil {
		return err
	}
	if len(failed) > 0 {
		slices.Sort(failed)
		return fmt.Errorf("the events of %s could not be read", strings.Join(failed, ", "))
	}
	return nil
}

// fullID matches a whole session id.
var fullID = regexp.MustCompile(`^ses_[0-9a-f]{32}$`)

// resolveForEvents turns a --filter session= argument into a session id, by roostd, once.
// A full id roostd no longer knows is taken as it is: the log keeps a removed session's
// events until compaction.
func resolveForEvents(ctx context.Context, c roostv1.SessionServiceClient, ref string) (string, error) {
	resp, err := c.Get(ctx, &roostv1.GetRequest{Id: ref})
	if err == nil {
		return resp.GetSession().GetId(), nil
	}
	if status.Code(err) == codes.NotFound && fullID.MatchString(ref) {
		return ref, nil
	}
	return "", fmt.Errorf("--filter session=%s: %s", ref, status.Convert(err).Message())
}
