package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// helpWidth is what every help text is written to fit: roostctl --help and each command's
// help stay within it (a test holds them to it).
const helpWidth = 100

// usageTemplate is cobra's default with its flag lists wrapped to helpWidth.
const usageTemplate = `Usage:{{if .Runnable}}
  {{.UseLine}}{{end}}{{if .HasAvailableSubCommands}}
  {{.CommandPath}} [command]{{end}}{{if gt (len .Aliases) 0}}

Aliases:
  {{.NameAndAliases}}{{end}}{{if .HasExample}}

Examples:
{{.Example}}{{end}}{{if .HasAvailableSubCommands}}{{$cmds := .Commands}}{{if eq (len .Groups) 0}}

Available Commands:{{range $cmds}}{{if (or .IsAvailableCommand (eq .Name "help"))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{else}}{{range $group := .Groups}}

{{.Title}}{{range $cmds}}{{if (and (eq .GroupID $group.ID) (or .IsAvailableCommand (eq .Name "help")))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{if not .AllChildCommandsHaveGroup}}

Additional Commands:{{range $cmds}}{{if (and (eq .GroupID "") (or .IsAvailableCommand (eq .Name "help")))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{end}}{{end}}{{if .HasAvailableLocalFlags}}

Flags:
{{(.LocalFlags.FlagUsagesWrapped 100) | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableInheritedFlags}}

Global Flags:
{{(.InheritedFlags.FlagUsagesWrapped 100) | trimTrailingWhitespaces}}{{end}}{{if .HasHelpSubCommands}}

Additional help topics:{{range .Commands}}{{if .IsAdditionalHelpTopicCommand}}
  {{rpad .CommandPath .CommandPathPadding}} {{.Short}}{{end}}{{end}}{{end}}{{if .HasAvailableSubCommands}}

Use "{{.CommandPath}} [command] --help" for more information about a command.{{end}}
`

// completeArgs gives every command whose arguments are sessions or capsules completion of
// them, from what roostd holds: the command tree says which by its Use line.
func (a *app) completeArgs(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.ValidArgsFunction == nil {
			switch {
			case strings.Contains(c.Use, "SESSION"):
				c.ValidArgsFunction = a.completeSessions
			case strings.Contains(c.Use, " CAPSULE"):
				c.ValidArgsFunction = a.completeCapsules
			case strings.Contains(c.Use, " NAME@VERSION"):
				c.ValidArgsFunction = a.completeArtifacts
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// completionContext bounds a completion's RPC: a shell waiting on a dead daemon would hang
// the operator's prompt.
func completionContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Second)
}

// liveStates are the states of a session that has a process (or is about to, or is
// ending): what stop and kill act on.
var liveStates = []string{"launching", "running", "paused", "stopping"}

// actsOn is the states of the sessions each verb can act on, as roostd decides them; a
// verb not here (logs, inspect, wait, stats) takes a session in any state. rm's is without
// --force, which takes any.
var actsOn = map[string][]string{
	"launch": {"staged"},
	"stop":   liveStates,
	"kill":   liveStates,
	"pause":  {"running"},
	"resume": {"paused"},
	"exec":   {"running"},
	"rm":     {"staged", "exited"},
}

// completeSessions offers names, then ids, of the sessions cmd can act on, each described
// by its capsule and state; a verb that takes one SESSION is offered nothing once it has
// one, and one that takes several is not offered again those already on the line.
func (a *app) completeSessions(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if cmd.Name() == "exec" && len(args) > 0 {
		return nil, cobra.ShellCompDirectiveDefault
	}
	if len(args) > 0 && !strings.Contains(cmd.Use, "SESSION...") {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := a.sessions()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := completionContext()
	defer cancel()
	resp, err := c.List(ctx, &roostv1.ListRequest{All: true})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	force, _ := cmd.Flags().GetBool("force")
	var out []cobra.Completion
	for _, s := range actedOn(cmd.Name(), force, resp.GetSessions(), args) {
		desc := fmt.Sprintf("%s %s", s.GetCapsule().GetName(), s.GetState())
		if n := s.GetName(); n != "" && strings.HasPrefix(n, toComplete) {
			out = append(out, cobra.CompletionWithDesc(n, desc))
		}
		if strings.HasPrefix(s.GetId(), toComplete) {
			out = append(out, cobra.CompletionWithDesc(s.GetId(), desc))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// actedOn is those of list that verb can act on (rm with force is rm -f), but for those
// named in given already (by name or id). rm without --force refuses a tree with a live
// session in it, so an ended session with a live descendant is not offered either.
func actedOn(verb string, force bool, list []*roostv1.Session, given []string) []*roostv1.Session {
	states, some := actsOn[verb]
	if verb == "rm" && force {
		some = false
	}
	var liveBelow map[string]bool
	if verb == "rm" && !force {
		liveBelow = liveAncestors(list)
	}
	var out []*roostv1.Session
	for _, s := range list {
		switch {
		case some && !slices.Contains(states, s.GetState()),
			liveBelow[s.GetId()],
			slices.Contains(given, s.GetId()),
			s.GetName() != "" && slices.Contains(given, s.GetName()):
			continue
		}
		out = append(out, s)
	}
	return out
}

// liveAncestors is the set of sessions of list with a live session below them.
func liveAncestors(list []*roostv1.Session) map[string]bool {
	parent := make(map[string]string, len(list))
	for _, s := range list {
		parent[s.GetId()] = s.GetParentId()
	}
	out := map[string]bool{}
	for _, s := range list {
		if !slices.Contains(liveStates, s.GetState()) {
			continue
		}
		for p := parent[s.GetId()]; p != "" && !out[p]; p = parent[p] {
			out[p] = true
		}
	}
	return out
}

// completeArtifacts offers the pushed capsules' name@version.
func (a *app) completeArtifacts(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	conn, err := a.connect()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := completionContext()
	defer cancel()
	resp, err := roostv1.NewArtifactServiceClient(conn).ListArtifacts(ctx, &roostv1.ListArtifactsRequest{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, art := range resp.GetArtifacts() {
		ref := art.GetName() + "@" + art.GetVersion()
		if strings.HasPrefix(ref, toComplete) {
			out = append(out, cobra.CompletionWithDesc(ref, "pushed "+art.GetPushedAt().AsTime().Local().Format(time.DateTime)))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeCapsules offers pushed capsules and, for a path, the directories holding a
// capsule.yaml below what was typed.
func (a *app) completeCapsules(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	out, _ := a.completeArtifacts(cmd, args, toComplete)
	dir, prefix := filepath.Split(toComplete)
	readDir := dir
	if readDir == "" {
		readDir = "."
	}
	entries, err := os.ReadDir(readDir)
	if err != nil {
		return out, cobra.ShellCompDirectiveNoFileComp
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) || strings.HasPrefix(e.Name(), ".") && !strings.HasPrefix(prefix, ".") {
			continue
		}
		path := dir + e.Name()
		if _, err := os.Stat(filepath.Join(path, "capsule.yaml")); err == nil {
			out = append(out, cobra.CompletionWithDesc(path, "capsule"))
		} else {
			// A directory further down may hold one; let the shell go on into it.
			out = append(out, cobra.Completion(path+"/"))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
}
