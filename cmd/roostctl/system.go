package main

import (
	"fmt"
	"runtime"
	"text/tabwriter"

	"github.com/spf13/cobra"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/version"
)

func (a *app) doctorCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Report which containment classes this host and build can deliver",
		Long: `doctor asks roostd to probe its host: each containment class, available or why not,
and the facts behind that answer (Landlock, seccomp, cgroups, namespaces, the state
directory's fsync cost), each problem with a hint to fix it.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.system()
			if err != nil {
				return err
			}
			resp, err := c.Doctor(cmd.Context(), &roostv1.DoctorRequest{})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			out := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CLASS\tAVAILABLE\tDETAIL")
			for _, cl := range resp.GetClasses() {
				avail := "no"
				if cl.GetAvailable() {
					avail = "yes"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", cl.GetClass(), avail, cl.GetDetail())
			}
			tw.Flush()
			fmt.Fprintf(out, "\nstrongest class: %s\n\n", resp.GetStrongest())
			tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL")
			for _, ch := range resp.GetChecks() {
				detail := ch.GetDetail()
				if ch.GetHint() != "" {
					detail += " — " + ch.GetHint()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", ch.GetName(), ch.GetStatus(), detail)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func (a *app) versionCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print roostctl's and roostd's versions",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			client := &roostv1.VersionResponse{Version: version.Version, Commit: version.Commit, GoVersion: runtime.Version()}
			var server *roostv1.VersionResponse
			var serverErr error
			if c, err := a.system(); err != nil {
				serverErr = err
			} else {
				server, serverErr = c.Version(cmd.Context(), &roostv1.VersionRequest{})
			}
			out := cmd.OutOrStdout()
			if asJSON {
				fmt.Fprint(out, `{"client":`)
				data, _ := marshal(client)
				out.Write(data)
				if server != nil {
					fmt.Fprint(out, `,"server":`)
					data, _ = marshal(server)
					out.Write(data)
				}
				fmt.Fprintln(out, "}")
			} else {
				fmt.Fprintf(out, "roostctl %s %s %s\n", client.GetVersion(), client.GetCommit(), client.GetGoVersion())
				if server != nil {
					fmt.Fprintf(out, "roostd   %s %s %s (registry %s)\n", server.GetVersion(), server.GetCommit(), server.GetGoVersion(), server.GetSchema())
				}
			}
			if serverErr != nil {
				return serverErr
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print versions as JSON")
	return cmd
}
