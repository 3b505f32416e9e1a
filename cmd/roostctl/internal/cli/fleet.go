package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// printFleetDay is a fleet day as spend --fleet shows it.
func printFleetDay(out io.Writer, resp *roostv1.GetFleetResponse) error {
	d := resp.GetDay()
	state := "open"
	if !d.GetOpen() {
		state = "not open yet (no node took from it; the ceiling shown is the standing one)"
	}
	fmt.Fprintf(out, "day         %s (UTC), %s\n", d.GetDate(), state)
	fmt.Fprintf(out, "ceiling     %s\n", limitOrNone(d.GetCeiling()))
	fmt.Fprintf(out, "granted     %d, %d left in the pool\n", d.GetGranted(), max(d.GetCeiling()-d.GetGranted(), 0))
	fmt.Fprintf(out, "this node   %s\n", resp.GetNode())
	if len(d.GetNodes()) == 0 {
		return nil
	}
	fmt.Fprintln(out)
	return printFleetNodes(out, d.GetNodes(), resp.GetNode())
}

func printFleetNodes(out io.Writer, nodes []*roostv1.FleetNodeDay, self string) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tHELD\tSPENT\tRETURNED\tWRITTEN OFF\tBLOCKS")
	for _, n := range nodes {
		name := n.GetNode()
		if name == self {
			name += " (this)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", name, n.GetHeld(), n.GetSpent(), n.GetReturned(), n.GetWrittenOff(), n.GetBlocks())
	}
	return tw.Flush()
}

// printFleetNodeTable is fleet nodes' table: every node the directory or today's ledger
// knows, by name, with what the directory says of it beside its part of the day.
func printFleetNodeTable(out io.Writer, resp *roostv1.ListFleetNodesResponse) error {
	ledger := map[string]*roostv1.FleetNodeDay{}
	dir := map[string]*roostv1.FleetDirectoryNode{}
	var names []string
	for _, n := range resp.GetNodes() {
		ledger[n.GetNode()] = n
		names = append(names, n.GetNode())
	}
	for _, n := range resp.GetDirectory() {
		dir[n.GetNode()] = n
		if ledger[n.GetNode()] == nil {
			names = append(names, n.GetNode())
		}
	}
	slices.Sort(names)
	self := resp.GetSelf().GetNode()
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tREACHABLE\tADDRESS\tCLASSES\tSESSIONS\tCPUS\tMEMORY\tWARM\tVERSION\tHELD\tSPENT\tRETURNED\tWRITTEN OFF\tBLOCKS")
	for _, name := range names {
		row := name
		if name == self {
			row += " (this)"
		}
		if d := dir[name]; d != nil {
			reach := "yes"
			switch {
			case d.GetState() == "stopped":
				reach = "stopped"
			case !d.GetReachable():
				reach = "unreachable"
			}
			warm := 0
			for _, k := range d.GetWarm() {
				warm += int(k)
			}
			row += fmt.Sprintf("\t%s\t%s\t%s\t%d\t%d\t%s\t%d\t%s", reach, orDash(d.GetAddress()), orDash(strings.Join(d.GetClasses(), ",")),
				d.GetSessionsRunning(), d.GetCpus(), bytesIEC(d.GetMemoryBytes()), warm, orDash(d.GetVersion()))
		} else {
			// In the ledger, not in the directory: it never registered, or was forgotten.
			row += "\tunknown\t-\t-\t-\t-\t-\t-\t-"
		}
		if l := ledger[name]; l != nil {
			row += fmt.Sprintf("\t%d\t%d\t%d\t%d\t%d", l.GetHeld(), l.GetSpent(), l.GetReturned(), l.GetWrittenOff(), l.GetBlocks())
		} else {
			row += "\t0\t0\t0\t0\t0"
		}
		fmt.Fprintln(tw, row)
	}
	return tw.Flush()
}

func (a *app) spendFleet(ctx context.Context, out io.Writer, day string, asJSON bool) error {
	conn, err := a.connect()
	if err != nil {
		return err
	}
	resp, err := roostv1.NewSpendServiceClient(conn).GetFleet(ctx, &roostv1.GetFleetRequest{Day: day})
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(out, resp)
	}
	return printFleetDay(out, resp)
}

func (a *app) setFleetLimit(ctx context.Context, out io.Writer, tokens int64, asJSON bool) error {
	conn, err := a.connect()
	if err != nil {
		return err
	}
	resp, err := roostv1.NewSpendServiceClient(conn).SetFleetLimit(ctx, &roostv1.SetFleetLimitRequest{Tokens: tokens})
	if err != nil {
		return err
	}
	if asJSON {
		return printJSONLine(out, resp)
	}
	fmt.Fprintf(out, "fleet ceiling: %s (was %s)\n", ceiling(resp.GetTokens()), ceiling(resp.GetPrevious()))
	return nil
}

func (a *app) fleetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "The fleet ledger's nodes: list them, forget a lost one",
		Long: `fleet looks at the fleet ledger this roostd is a node of (roostd --fleet-etcd): one daily
token ceiling shared by many roostd nodes through etcd. roostctl spend --fleet shows the
day's ledger; roostctl spend set-limit --fleet sets its ceiling.`,
	}
	cmd.AddCommand(a.fleetNodesCommand(), a.fleetNodeCommand())
	return cmd
}

func (a *app) fleetNodesCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the fleet's nodes: how each is reached, what it can take, its part of today",
		Long: `nodes lists the fleet's nodes: every node in the node directory (reachable, or
unreachable when its lease lapsed, or stopped; its mTLS address, the containment classes it
delivers, its sessions, CPUs, memory, warm sandboxes and version) and every node of today's
ledger (UTC): what each holds of the fleet ceiling, what it last said it spent, gave back and
had written off; and this node's own view of its part: whether it reaches etcd, and writes
whose outcome it has yet to learn.`,
		Example: `  roostctl fleet nodes
  roostctl fleet nodes --json | jq '.nodes[] | select(.held != "0")'
  roostctl fleet nodes --json | jq -r '.directory[] | select(.reachable) | .address'`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := a.connect()
			if err != nil {
				return err
			}
			resp, err := roostv1.NewSpendServiceClient(conn).ListFleetNodes(cmd.Context(), &roostv1.ListFleetNodesRequest{})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return printJSON(out, resp)
			}
			s := resp.GetSelf()
			reach := "reaches etcd"
			if s.GetUnreachable() {
				reach = "cannot reach etcd: spends what it holds, then refuses"
			}
			fmt.Fprintf(out, "day         %s (UTC)\n", resp.GetDate())
			fmt.Fprintf(out, "this node   %s: holds %d, used %d, %s; %d writes undecided\n\n", s.GetNode(), s.GetHeld(), s.GetUsed(), reach, s.GetPending())
			return printFleetNodeTable(out, resp)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the nodes as JSON")
	return cmd
}

func (a *app) fleetNodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Act on one fleet node",
	}
	cmd.AddCommand(a.fleetForgetCommand())
	return cmd
}

func (a *app) fleetForgetCommand() *cobra.Command {
	var yes, asJSON bool
	cmd := &cobra.Command{
		Use:   "forget NODE",
		Short: "Write a lost node's blocks off as spent, say the under-use, drop it from the directory",
		Long: `forget writes off as spent every block NODE holds, on every day it holds any,
deletes its node-directory entry and marks its sessions lost in the session directory
(ps --fleet lists them lost, with the state they were in): for a node that is gone (its
host lost, its state directory with it). Nothing it held goes back
to the pool, since nothing says it no longer spends (a lease lapsing says only that it
cannot be heard); the fleet ceiling is never overshot for it. What of the written-off
tokens the node never spent is the under-use: tokens the fleet cannot spend that day.
Forgetting a node that comes back is safe: what it spends of its blocks was counted.
On a terminal it asks first; --yes does not.`,
		Example: `  roostctl fleet node forget node-c
  roostctl fleet node forget --yes --json node-c`,
		Args: exactArgs(1, "one NODE name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			node := args[0]
			conn, err := a.connect()
			if err != nil {
				return err
			}
			c := roostv1.NewSpendServiceClient(conn)
			stderr := cmd.ErrOrStderr()
			if !yes && isTerminal(cmd.InOrStdin()) {
				fl, err := c.GetFleet(cmd.Context(), &roostv1.GetFleetRequest{})
				if err != nil {
					return err
				}
				var held int64
				for _, n := range fl.GetDay().GetNodes() {
					if n.GetNode() == node {
						held = n.GetHeld()
					}
				}
				fmt.Fprintf(stderr, "Write off as spent every block %s holds (%d tokens today)? Do this only for a node that is gone. [y/N] ", node, held)
				answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				switch strings.ToLower(strings.TrimSpace(answer)) {
				case "y", "yes":
				default:
					fmt.Fprintln(stderr, "nothing written off")
					return nil
				}
			}
			resp, err := c.ForgetFleetNode(cmd.Context(), &roostv1.ForgetFleetNodeRequest{Node: node})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return printJSONLine(out, resp)
			}
			for _, day := range slices.Sorted(maps.Keys(resp.GetDays())) {
				fmt.Fprintf(out, "%s  %d tokens written off\n", day, resp.GetDays()[day])
			}
			fmt.Fprintf(out, "forgot %s: %d tokens written off as spent, of which at most %d it never spent (under-use)\n", resp.GetNode(), resp.GetWrittenOff(), resp.GetUnderUse())
			if resp.GetDirectoryEntryDeleted() {
				fmt.Fprintf(out, "deleted %s's node-directory entry\n", resp.GetNode())
			}
			if n := resp.GetSessionsLost(); n > 0 {
				fmt.Fprintf(out, "marked %d of %s's sessions lost in the session directory\n", n, resp.GetNode())
			}
			return nil
		},
	}
	cmd.ValidArgsFunction = a.completeFleetNodes
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was written off as JSON")
	return cmd
}

// completeFleetNodes offers the fleet's nodes of today but this one, each described by what
// it holds.
func (a *app) completeFleetNodes(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	conn, err := a.connect()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := completionContext()
	defer cancel()
	resp, err := roostv1.NewSpendServiceClient(conn).ListFleetNodes(ctx, &roostv1.ListFleetNodesRequest{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, n := range resp.GetNodes() {
		if n.GetNode() != resp.GetSelf().GetNode() && strings.HasPrefix(n.GetNode(), toComplete) {
			out = append(out, cobra.CompletionWithDesc(n.GetNode(), fmt.Sprintf("holds %d", n.GetHeld())))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
