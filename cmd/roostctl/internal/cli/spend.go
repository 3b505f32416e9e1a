package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/manifest"
)

func (a *app) spendCommand() *cobra.Command {
	var asJSON, calls, fleet bool
	var day, session string
	cmd := &cobra.Command{
		Use:   "spend",
		Short: "Show the token ledger of a day, or a session's model calls",
		Long: `spend shows the token ledger for one UTC day (today unless --day): the machine's
ceiling, what sessions were charged and what they hold reserved, per session and per capsule.

With --session ID --calls it lists the session's metered model calls as its trace records
them: when, route, model, status, input/output/cache tokens, reserved and charged, latency,
whether streamed, and the output cap when the gateway lowered it to fit the session's
ceilings (LOWERED 64000->12000). The trace keeps a quarter of resources.log_max_bytes of
them; past that it says so, and the day's ledger still counts every token.

With --fleet it shows the fleet ledger this roostd is a node of (roostd --fleet-etcd): the
day's fleet ceiling, what is granted of it in blocks, and per node what it holds, what it
last said it spent, what it gave back and what was written off (roostctl fleet node forget).`,
		Example: `  roostctl spend
  roostctl spend --fleet
  roostctl spend --session 7f3a9c --calls
  roostctl spend --session 7f3a9c --calls --json`,
		Args: exactArgs(0, "no arguments (set-limit is a subcommand)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if calls != (session != "") {
				return usageError{fmt.Errorf("--calls and --session ID go together: the calls of one session")}
			}
			if fleet {
				if calls {
					return usageError{fmt.Errorf("--fleet shows the fleet's day, --calls a session's calls: one or the other")}
				}
				return a.spendFleet(cmd.Context(), cmd.OutOrStdout(), day, asJSON)
			}
			conn, err := a.connect()
			if err != nil {
				return err
			}
			if calls {
				resp, err := roostv1.NewSpendServiceClient(conn).ListCalls(cmd.Context(), &roostv1.ListCallsRequest{SessionId: session})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), resp)
				}
				return printCalls(cmd.OutOrStdout(), resp)
			}
			resp, err := roostv1.NewSpendServiceClient(conn).GetDay(cmd.Context(), &roostv1.GetDayRequest{Day: day})
			if err != nil {
				return err
			}
			d := resp.GetDay()
			if asJSON {
				return printJSON(cmd.OutOrStdout(), d)
			}
			out := cmd.OutOrStdout()
			ceiling := "none"
			if d.GetMachineCeiling() > 0 {
				ceiling = fmt.Sprintf("%d tokens, %d left", d.GetMachineCeiling(), max(d.GetMachineCeiling()-d.GetCharged()-d.GetReserved(), 0))
			}
			fmt.Fprintf(out, "day         %s (UTC; resets %s)\n", d.GetDate(), d.GetResetsAt().AsTime().Format(time.RFC3339))
			fmt.Fprintf(out, "ceiling     %s\n", ceiling)
			fmt.Fprintf(out, "charged     %d\n", d.GetCharged())
			fmt.Fprintf(out, "reserved    %d in %d open reservations\n", d.GetReserved(), d.GetOpenReservations())
			fmt.Fprintf(out, "lifetime    %d\n", d.GetLifetime())
			if len(d.GetSessions()) > 0 {
				fmt.Fprintln(out)
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SESSION\tCAPSULE\tCHARGED\tRESERVED\tCEILING")
				for _, s := range d.GetSessions() {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", s.GetSessionId(), s.GetCapsule(), s.GetCharged(), s.GetReserved(), limitOrNone(s.GetCeiling()))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			if len(d.GetCapsules()) > 0 {
				fmt.Fprintln(out)
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "CAPSULE\tCHARGED")
				for _, c := range d.GetCapsules() {
					fmt.Fprintf(tw, "%s\t%d\n", c.GetCapsule(), c.GetCharged())
				}
				return tw.Flush()
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the day's ledger as JSON")
	cmd.Flags().StringVar(&day, "day", "", "the UTC day, YYYY-MM-DD (default today)")
	cmd.Flags().StringVar(&session, "session", "", "the session whose calls --calls lists")
	cmd.Flags().BoolVar(&calls, "calls", false, "list the session's metered model calls (with --session)")
	cmd.Flags().BoolVar(&fleet, "fleet", false, "show the fleet ledger's day: its ceiling, what is granted, and each node's part")
	cmd.AddCommand(a.setLimitCommand())
	return cmd
}

// printCalls is a session's calls as a table.
func printCalls(out io.Writer, resp *roostv1.ListCallsResponse) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tROUTE\tMODEL\tSTATUS\tINPUT\tOUTPUT\tCACHE R/W\tRESERVED\tCHARGED\tLATENCY\tSTREAM\tLOWERED")
	for _, c := range resp.GetCalls() {
		lowered := "-"
		if c.GetLoweredFrom() > 0 {
			lowered = fmt.Sprintf("%d->%d", c.GetLoweredFrom(), c.GetLoweredTo())
		}
		if c.GetInputCounted() {
			lowered += " (input counted upstream)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d/%d\t%d\t%d\t%dms\t%v\t%s\n", c.GetAt().AsTime().Format(time.RFC3339), c.GetRoute(), c.GetModel(),
			c.GetStatus(), c.GetInputTokens(), c.GetOutputTokens(), c.GetCacheReadTokens(), c.GetCacheWriteTokens(), c.GetReserved(), c.GetCharged(),
			c.GetLatencyMs(), c.GetStreamed(), lowered)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if resp.GetCapped() {
		fmt.Fprintln(out, "\nthe trace holds no more calls: they reached their part of resources.log_max_bytes; roostctl spend still counts every token")
	}
	return nil
}

func limitOrNone(n int64) string {
	if n == 0 {
		return "none"
	}
	return strconv.FormatInt(n, 10)
}

// ceiling says a machine ceiling in words.
func ceiling(n int64) string {
	if n == 0 {
		return "no limit"
	}
	return strconv.FormatInt(n, 10) + " tokens per UTC day"
}

func (a *app) setLimitCommand() *cobra.Command {
	var asJSON, fleet bool
	cmd := &cobra.Command{
		Use:   "set-limit TOKENS|none",
		Short: "Set the machine's tokens per UTC day (none or 0: no limit), at once",
		Long: `set-limit changes the machine's ceiling of tokens per UTC day while roostd runs;
none (or 0) removes it. It is kept across restarts unless roostd is given
--machine-tokens-per-day. Calls held by inference.on_exhausted: wait go on once the
ceiling lets them. TOKENS is a whole number, or one with k, M or G: 500k is 500,000 and
2M 2,000,000 (powers of 1000; Ki, Mi, Gi are for bytes and refused). --json prints the new
ceiling and the one it replaced, 0 for none: {"previous":"0","tokens":"2000000"} (numbers as
strings, as in every --json of roostctl).

With --fleet it sets the fleet's ceiling instead (roostd --fleet-etcd), standing and for
today. Lowered under what is granted, nodes give back what they hold unspent: what is spent
stays spent, and nodes take no more until the pool has room.`,
		Example: `  roostctl spend set-limit 2000000
  roostctl spend set-limit --fleet 50M
  roostctl spend set-limit 2M
  roostctl spend set-limit none
  roostctl spend set-limit --json 500k | jq -r .previous`,
		Args: exactArgs(1, "one TOKENS count or none"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var n int64
			if args[0] != "none" {
				var err error
				if n, err = manifest.ParseTokens(args[0]); err != nil {
					return usageError{fmt.Errorf("TOKENS %q: %w; or none to remove the limit", args[0], err)}
				}
			}
			if fleet {
				return a.setFleetLimit(cmd.Context(), cmd.OutOrStdout(), n, asJSON)
			}
			conn, err := a.connect()
			if err != nil {
				return err
			}
			resp, err := roostv1.NewSpendServiceClient(conn).SetMachineLimit(cmd.Context(), &roostv1.SetMachineLimitRequest{Tokens: n})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSONLine(cmd.OutOrStdout(), resp)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "machine ceiling: %s (was %s)\n", ceiling(resp.GetTokens()), ceiling(resp.GetPrevious()))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the new ceiling and the previous one as JSON")
	cmd.Flags().BoolVar(&fleet, "fleet", false, "set the fleet ledger's ceiling, shared by every node, instead of this machine's")
	// "-1" reaches cobra as a shorthand flag; say what is wrong with it as a number.
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		if strings.Contains(err.Error(), "unknown shorthand flag") {
			return usageError{fmt.Errorf("%w: a ceiling cannot be negative; none removes it", err)}
		}
		return usageError{err}
	})
	return cmd
}
