package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func (a *app) psCommand() *cobra.Command {
	var all, asJSON, quiet, tree bool
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List sessions (staged and live by default)",
		Long: `ps lists sessions that are staged or live; --all adds those that have ended.
With --tree each child a session spawned is listed under its parent.
With --json it prints a JSON array of the same objects inspect --json prints.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			resp, err := c.List(cmd.Context(), &roostv1.ListRequest{All: all})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch {
			case asJSON:
				return printJSONList(out, resp.GetSessions())
			case quiet:
				for _, s := range resp.GetSessions() {
					fmt.Fprintln(out, s.GetId())
				}
				return nil
			}
			rows := resp.GetSessions()
			prefixes := make([]string, len(rows))
			if tree {
				rows, prefixes = asTree(rows)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tCAPSULE\tSTATE\tCLASS\tCREATED\tDETAIL")
			for i, s := range rows {
				fmt.Fprintf(tw, "%s%s\t%s@%s\t%s\t%s\t%s\t%s\n", prefixes[i], s.GetId(), s.GetCapsule().GetName(), s.GetCapsule().GetVersion(),
					outcome(s), orDash(s.GetContainment().GetAchieved()), ago(s.GetCreatedAt()), s.GetDetail())
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include sessions that have ended")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of session records")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print session ids only")
	cmd.Flags().BoolVar(&tree, "tree", false, "list children under their parents")
	return cmd
}

// asTree orders sessions depth first, each child under its parent, and gives each row the
// prefix that draws the tree. A session whose parent is not listed is a root.
func asTree(list []*roostv1.Session) ([]*roostv1.Session, []string) {
	listed := map[string]bool{}
	for _, s := range list {
		listed[s.GetId()] = true
	}
	kids := map[string][]*roostv1.Session{}
	var roots []*roostv1.Session
	for _, s := range list {
		if p := s.GetParentId(); p != "" && listed[p] {
			kids[p] = append(kids[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	var rows []*roostv1.Session
	var prefixes []string
	var walk func(s *roostv1.Session, lead, branch string)
	walk = func(s *roostv1.Session, lead, branch string) {
		rows = append(rows, s)
		prefixes = append(prefixes, lead+branch)
		children := kids[s.GetId()]
		next := lead
		switch branch {
		case "├─ ":
			next += "│  "
		case "└─ ":
			next += "   "
		}
		for i, c := range children {
			b := "├─ "
			if i == len(children)-1 {
				b = "└─ "
			}
			walk(c, next, b)
		}
	}
	for _, r := range roots {
		walk(r, "", "")
	}
	return rows, prefixes
}
