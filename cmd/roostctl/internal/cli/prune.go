package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func (a *app) pruneCommand() *cobra.Command {
	var until time.Duration
	var dryRun, asJSON, force bool
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove ended sessions now: all of them, or those that ended over --until ago",
		Long: `prune removes every ended session, or with --until DUR those that ended more than DUR
ago, each as rm does: its registry entry, its records directory (logs, trace, exit status),
its home and the workdir roost made for it (a --workdir given to run is handed back, never
removed). Staged and live sessions stay, and so does an ended session a live session
descends from (each kept one is named on stderr, with why). The registry's event log is then
compacted to the sessions that remain, so events --since an older sequence number fails,
naming the oldest event kept; and the artifact store's capsule copies that no remaining
session records and no name@version names (see artifacts rm) are deleted.

roostd --retain-ended N and --retain-for DUR do the same by themselves, as sessions end;
prune is for a host that keeps every session (the default) or for now rather than later.

Records are audit material, and what prune removes is gone for good. So when its stdin is a
terminal, prune lists what it would remove and asks before removing it, unless --force (-f)
or --dry-run; from a script (stdin not a terminal) it never asks. Sessions that end between
the question and the answer go too.

--dry-run removes nothing and lists what would go. With --json it prints the whole answer:
removed and kept sessions (id, name, capsule, ended_at, exit_status, bytes, kept_because),
bytes, events_compacted. The real prune prints what it removed the same way.`,
		Example: `  roostctl prune --dry-run
  roostctl prune --until 24h
  roostctl prune -f --json`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if until < 0 {
				return usageError{fmt.Errorf("--until %s: must not be negative", until)}
			}
			c, err := a.sessions()
			if err != nil {
				return err
			}
			req := &roostv1.PruneRequest{DryRun: dryRun}
			if until > 0 {
				req.Until = durationpb.New(until)
			}
			// A pruned session's record carries no name: the list, read before anything goes,
			// has it.
			names, err := sessionNames(cmd.Context(), c)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !dryRun && !force && isTerminal(cmd.InOrStdin()) {
				ok, err := a.confirmPrune(cmd, c, req, names)
				if err != nil || !ok {
					return err
				}
			}
			resp, err := c.Prune(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return printPruneJSON(out, resp, names)
			}
			printPruned(out, resp.GetRemoved(), names)
			n := len(resp.GetRemoved())
			switch {
			case dryRun:
				fmt.Fprintf(out, "would remove %d ended %s, %s on disk\n", n, plural(n, "session"), bytesIEC(resp.GetBytes()))
			default:
				fmt.Fprintf(out, "removed %d ended %s, %s freed; %d %s compacted\n", n, plural(n, "session"), bytesIEC(resp.GetBytes()), resp.GetEventsCompacted(), plural(int(resp.GetEventsCompacted()), "event"))
			}
			for _, s := range resp.GetKept() {
				fmt.Fprintf(cmd.ErrOrStderr(), "kept %s: %s\n", named(s.GetId(), names), s.GetKeptBecause())
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&until, "until", 0, "only sessions that ended more than this long ago (e.g. 24h); default every ended session")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "remove nothing; list what would be removed")
	cmd.Flags().BoolVarP(&force, "force", "f", false, "do not ask, even on a terminal")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the answer as JSON")
	return cmd
}

// sessionNames maps the id of every session roostd holds that has a name to it.
func sessionNames(ctx context.Context, c roostv1.SessionServiceClient) (map[string]string, error) {
	resp, err := c.List(ctx, &roostv1.ListRequest{All: true})
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	for _, s := range resp.GetSessions() {
		if s.GetName() != "" {
			names[s.GetId()] = s.GetName()
		}
	}
	return names, nil
}

// named is a session's id with its name, when it has one: "ses_01j9… (build-1)".
func named(id string, names map[string]string) string {
	if n := names[id]; n != "" {
		return fmt.Sprintf("%s (%s)", id, n)
	}
	return id
}

// printPruned lists sessions prune removed (or would remove).
func printPruned(w io.Writer, list []*roostv1.PrunedSession, names map[string]string) {
	if len(list) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tNAME\tCAPSULE\tENDED\tSTATUS\tSIZE")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s@%s\t%s\t%s\t%s\n", s.GetId(), orDash(names[s.GetId()]), s.GetCapsule().GetName(), s.GetCapsule().GetVersion(), ago(s.GetEndedAt()), orDash(s.GetExitStatus()), bytesIEC(s.GetBytes()))
	}
	tw.Flush()
}

// printPruneJSON writes resp as protojson, each removed and kept session with a "name"
// after its "id" ("" for one without), keys in the proto's field order.
func printPruneJSON(w io.Writer, resp *roostv1.PruneResponse, names map[string]string) error {
	data, err := marshal(resp)
	if err != nil {
		return err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return err
	}
	entry := (&roostv1.PrunedSession{}).ProtoReflect().Descriptor()
	for key, list := range map[string][]*roostv1.PrunedSession{"removed": resp.GetRemoved(), "kept": resp.GetKept()} {
		var entries []map[string]json.RawMessage
		if err := json.Unmarshal(top[key], &entries); err != nil {
			return err
		}
		var arr bytes.Buffer
		arr.WriteByte('[')
		for i, e := range entries {
			name, _ := json.Marshal(names[list[i].GetId()])
			e["name"] = name
			if i > 0 {
				arr.WriteByte(',')
			}
			writeOrdered(&arr, e, entry, "id", "name")
		}
		arr.WriteByte(']')
		top[key] = arr.Bytes()
	}
	var buf bytes.Buffer
	writeOrdered(&buf, top, resp.ProtoReflect().Descriptor(), "", "")
	return writeIndented(w, buf.Bytes())
}

// writeOrdered writes obj as a JSON object with its keys in desc's field order, extra
// right after the field after (none when extra is "").
func writeOrdered(buf *bytes.Buffer, obj map[string]json.RawMessage, desc protoreflect.MessageDescriptor, after, extra string) {
	buf.WriteByte('{')
	first := true
	put := func(key string) {
		if !first {
			buf.WriteByte(',')
		}
		first = false
		k, _ := json.Marshal(key)
		buf.Write(k)
		buf.WriteByte(':')
		buf.Write(obj[key])
	}
	fields := desc.Fields()
	for i := range fields.Len() {
		key := string(fields.Get(i).Name())
		if _, ok := obj[key]; !ok {
			continue
		}
		put(key)
		if key == after && extra != "" {
			put(extra)
		}
	}
	buf.WriteByte('}')
}

// confirmPrune asks the person at the terminal whether to remove what a dry run of req
// lists; true to go on. Nothing to remove needs no answer (prune still compacts the log and
// collects capsule copies). Anything but y or yes is no, and no is not a failure: nothing
// was asked of roostd that it refused.
func (a *app) confirmPrune(cmd *cobra.Command, c roostv1.SessionServiceClient, req *roostv1.PruneRequest, names map[string]string) (bool, error) {
	dry := proto.CloneOf(req)
	dry.DryRun = true
	resp, err := c.Prune(cmd.Context(), dry)
	if err != nil {
		return false, err
	}
	n := len(resp.GetRemoved())
	if n == 0 {
		return true, nil
	}
	stderr := cmd.ErrOrStderr()
	printPruned(stderr, resp.GetRemoved(), names)
	fmt.Fprintf(stderr, "Remove these %d ended %s (%s) with their records, for good? [y/N] ", n, plural(n, "session"), bytesIEC(resp.GetBytes()))
	answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true, nil
	}
	fmt.Fprintln(stderr, "nothing removed")
	return false, nil
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
