package main

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func (a *app) explainCommand() *cobra.Command {
	var containment string
	var deadline time.Duration
	var asJSON, oci bool
	cmd := &cobra.Command{
		Use:   "explain CAPSULE",
		Short: "Show a capsule's effective grants and containment, without running it",
		Long: `explain reads CAPSULE as stage would and prints what a session of it would get: the
containment floor and where it comes from, the class this host delivers (or why it
cannot), and every grant with its resolved value and what enforces it. Nothing is
recorded. The JSON form is what a session's trace.jsonl records as session_start.

With --oci it prints instead the OCI runtime spec (config.json) a sealed session of the
capsule runs with, as another runtime (runc, crun) would take it; paths name a session
called SESSION.`,
		Args: exactArgs(1, "one CAPSULE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			abs, err := capsuleArg(args[0])
			if err != nil {
				return err
			}
			req := &roostv1.ExplainRequest{Capsule: abs, Containment: containment, Oci: oci}
			if deadline != 0 {
				req.Deadline = durationpb.New(deadline)
			}
			c, err := a.capsules()
			if err != nil {
				return err
			}
			resp, err := c.Explain(cmd.Context(), req)
			if err != nil {
				return err
			}
			e := resp.GetExplanation()
			if oci {
				fmt.Fprintln(cmd.OutOrStdout(), resp.GetOciConfig())
				return nil
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), e)
			}
			printExplanation(cmd, e)
			return nil
		},
	}
	cmd.Flags().StringVar(&containment, "containment", "", "explain with this floor, as run --containment")
	cmd.Flags().DurationVar(&deadline, "deadline", 0, "explain with this deadline, as run --deadline")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the explanation as JSON")
	cmd.Flags().BoolVar(&oci, "oci", false, "print the OCI runtime spec (config.json) of a sealed session instead")
	return cmd
}

func printExplanation(cmd *cobra.Command, e *roostv1.Explanation) {
	out := cmd.OutOrStdout()
	c := e.GetCapsule()
	d := e.GetContainment()
	fmt.Fprintf(out, "capsule      %s@%s  %s\n", c.GetName(), c.GetVersion(), c.GetSha256())
	fmt.Fprintf(out, "source       %s\n", c.GetSource())
	fmt.Fprintf(out, "floor        %s  (", d.GetDeclared())
	for i, s := range d.GetSources() {
		if i > 0 {
			fmt.Fprint(out, ", ")
		}
		fmt.Fprintf(out, "%s: %s", s.GetSource(), s.GetClass())
	}
	fmt.Fprintln(out, ")")
	if d.GetFloorMet() {
		fmt.Fprintf(out, "achieved     %s\n", d.GetAchieved())
		fmt.Fprintf(out, "mechanism    %s\n", d.GetMechanism())
	} else {
		fmt.Fprintf(out, "achieved     none: staging would be refused\n")
		fmt.Fprintf(out, "shortfall    %s\n", d.GetShortfallReason())
	}
	if id := e.GetIdentity(); id != nil {
		switch {
		case id.GetHostRoot():
			fmt.Fprintln(out, "runs as      host root: roostd's sessions.allow_root names this capsule")
		case d.GetAchieved() == "sealed" || !d.GetFloorMet() && d.GetDeclared() == "sealed":
			fmt.Fprintf(out, "runs as      root in a user namespace mapping ids 0-%d onto a host uid range of its own (allocated at stage)\n", id.GetSize()-1)
		default:
			fmt.Fprintln(out, "runs as      an unprivileged host uid of its own (allocated at stage), no capabilities, no_new_privs")
		}
	}
	if r := e.GetReadable(); len(r) > 0 {
		fmt.Fprintf(out, "reads        %s\n", strings.Join(r, "; "))
	}
	if x := e.GetExecutable(); len(x) > 0 {
		fmt.Fprintf(out, "executes     %s\n", strings.Join(x, "; "))
	}
	for i, sh := range e.GetShell() {
		label := ""
		if i == 0 {
			label = "shell.allow"
		}
		what := append(slices.Clone(sh.GetFiles()), sh.GetTrees()...)
		for j := len(sh.GetFiles()); j < len(what); j++ {
			what[j] += "/ (tree)"
		}
		fmt.Fprintf(out, "%-12s %s → %s\n", label, sh.GetEntry(), strings.Join(what, " "))
	}
	for i, v := range e.GetEnv() {
		label := ""
		if i == 0 {
			label = "host env"
		}
		fmt.Fprintf(out, "%-12s %s: %s (%s)\n", label, v.GetName(), v.GetVerdict(), v.GetReason())
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GRANT\tVALUE\tENFORCEMENT\tHOW")
	for _, g := range e.GetGrants() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", g.GetKey(), g.GetValue(), orDash(g.GetEnforcement()), g.GetMechanism())
	}
	tw.Flush()
}
