package cli

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
and the facts behind that answer (Landlock, seccomp, cgroups, user namespaces and the
host ids sessions run as, the state directory's fsync cost), each problem with a hint to
fix it.`,
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
			if u := resp.GetUserNamespaces(); u != nil {
				tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				for _, l := range userNamespaceLines(u) {
					fmt.Fprintf(tw, "%s\t%s\n", l[0], l[1])
				}
				tw.Flush()
				fmt.Fprintln(out)
			}
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

// userNamespaceLines are doctor's user namespace facts as name and text, one per line.
func userNamespaceLines(u *roostv1.UserNamespaces) [][2]string {
	ids := fmt.Sprintf("%d ids of their own from %d–%d (%d ranges)", u.GetIdsPerSession(), u.GetIdFirst(), u.GetIdLast(), u.GetRanges())
	var lines [][2]string
	switch {
	case !u.GetAvailable():
		lines = append(lines, [2]string{"user namespaces", "no (user.max_user_namespaces is 0 or absent): sealed sessions cannot run — raise it (sysctl -w user.max_user_namespaces=N) or boot a kernel with CONFIG_USER_NS=y; sessions would map root to " + ids})
	case !u.GetMappingWorks():
		lines = append(lines, [2]string{"user namespaces", fmt.Sprintf("yes (max %d), but roostd cannot create one mapped to its ids, so sealed sessions cannot run: %s", u.GetMax(), u.GetDetail())})
	default:
		lines = append(lines, [2]string{"user namespaces", fmt.Sprintf("yes (max %d); sealed sessions map root to %s", u.GetMax(), ids)})
	}
	if u.GetUnprivilegedClonePresent() {
		v := "0: unprivileged users may not create user namespaces"
		if u.GetUnprivilegedClone() {
			v = "1: unprivileged users may create user namespaces"
		}
		lines = append(lines, [2]string{"userns clone", "kernel.unprivileged_userns_clone = " + v + "; roostd runs as root and is not bound by it"})
	}
	apparmor := "AppArmor not enabled"
	if u.GetApparmorEnabled() {
		apparmor = "AppArmor enabled"
	}
	switch {
	case !u.GetApparmorPresent():
		lines = append(lines, [2]string{"apparmor userns", "not restricted (kernel.apparmor_restrict_unprivileged_userns absent; " + apparmor + ")"})
	case u.GetApparmorRestricted() && !u.GetApparmorEnabled():
		lines = append(lines, [2]string{"apparmor userns", "not in force (kernel.apparmor_restrict_unprivileged_userns = 1, but AppArmor is not enabled)"})
	case u.GetApparmorRestricted():
		lines = append(lines, [2]string{"apparmor userns", "restricts unprivileged processes (kernel.apparmor_restrict_unprivileged_userns = 1; " + apparmor + "); roostd runs as root and is not restricted"})
	default:
		lines = append(lines, [2]string{"apparmor userns", "not restricted (kernel.apparmor_restrict_unprivileged_userns = 0; " + apparmor + ")"})
	}
	if len(u.GetConflicts()) == 0 {
		lines = append(lines, [2]string{"session ids", "free: no account, group or subordinate id delegation holds one"})
		return lines
	}
	name := "session ids"
	for _, c := range u.GetConflicts() {
		lines = append(lines, [2]string{name, "warn: " + c})
		name = ""
	}
	return append(lines, [2]string{"", "— " + u.GetHint()})
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
