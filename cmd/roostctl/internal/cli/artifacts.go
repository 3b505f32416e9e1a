package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func (a *app) pushCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "push DIR",
		Short: "Store a capsule as name@version, pinned by its digest",
		Long: `push stores the capsule in DIR under the name and version its capsule.yaml declares,
content-addressed by the sha256 of its tree. run, stage and spawn then take name@version.
Pushing the same bytes again changes nothing; different bytes under a name@version already
pushed are refused: give them a new version (or remove the old one: artifacts rm).

On a terminal, a push that takes a while shows on stderr how many files and bytes DIR holds
and how long it has been going, on one line redrawn in place.`,
		Example: `  roostctl push examples/worker
  roostctl run worker@0.1.0`,
		Args: exactArgs(1, "one DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			abs, err := treePath(args[0])
			if err != nil {
				return err
			}
			conn, err := a.connect()
			if err != nil {
				return err
			}
			var pp *pushProgress
			if isTerminal(cmd.ErrOrStderr()) {
				// Counted here, before the RPC, only for the person watching: roostd counts
				// (and checks) what it stores itself.
				pp = startPushProgress(cmd.ErrOrStderr(), args[0])
				pp.count(countTree(abs, func(n treeCount) { pp.count(n, false) }), true)
			}
			resp, err := roostv1.NewArtifactServiceClient(conn).Push(cmd.Context(), &roostv1.PushRequest{Path: abs})
			if pp != nil {
				pp.finish(err == nil)
			}
			if err != nil {
				if status.Code(err) == codes.AlreadyExists {
					return withCode(exitFailure, err)
				}
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			a := resp.GetArtifact()
			verb := "pushed"
			if !resp.GetCreated() {
				verb = "already pushed"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s@%s %s\n", verb, a.GetName(), a.GetVersion(), a.GetSha256())
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func (a *app) artifactsCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "artifacts",
		Short: "List pushed capsules; artifacts rm removes them",
		Long: `artifacts lists the capsules pushed to roostd's artifact store (roostctl push), by
name@version: the first 16 hex digits of each one's sha256, its files, their size and when
it was pushed. run, stage, explain and a capsule's spawns take name@version.

artifacts ls is the same; artifacts rm NAME@VERSION removes one (see artifacts rm --help).
--json prints a JSON array: name, version, sha256, pushed_at, files, bytes (as in every
proto3 JSON, the 64-bit files and bytes are strings).`,
		Example: `  roostctl artifacts
  roostctl artifacts --json | jq -r '.[] | .name + "@" + .version'
  roostctl artifacts rm worker@0.1.0`,
		Args: exactArgs(0, "no arguments (or a subcommand: ls, rm)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.listArtifacts(cmd, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.AddCommand(a.artifactsLsCommand(), a.artifactsRmCommand())
	return cmd
}

func (a *app) artifactsLsCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List pushed capsules (as artifacts does)",
		Example: `  roostctl artifacts ls
  roostctl artifacts ls --json`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.listArtifacts(cmd, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func (a *app) listArtifacts(cmd *cobra.Command, asJSON bool) error {
	conn, err := a.connect()
	if err != nil {
		return err
	}
	resp, err := roostv1.NewArtifactServiceClient(conn).ListArtifacts(cmd.Context(), &roostv1.ListArtifactsRequest{})
	if err != nil {
		return err
	}
	if asJSON {
		return printJSONList(cmd.OutOrStdout(), resp.GetArtifacts())
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CAPSULE\tSHA256\tFILES\tSIZE\tPUSHED")
	for _, a := range resp.GetArtifacts() {
		fmt.Fprintf(tw, "%s@%s\t%s\t%d\t%s\t%s\n", a.GetName(), a.GetVersion(), shortDigest(a.GetSha256()),
			a.GetFiles(), bytesIEC(a.GetBytes()), ago(a.GetPushedAt()))
	}
	return tw.Flush()
}

// shortDigest is the first 16 hex digits of a "sha256:<hex>" digest.
func shortDigest(d string) string {
	hex := strings.TrimPrefix(d, "sha256:")
	if len(hex) > 16 {
		return hex[:16]
	}
	return hex
}

func (a *app) artifactsRmCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "rm NAME@VERSION...",
		Aliases: []string{"remove"},
		Short:   "Remove pushed capsules by name@version",
		Long: `artifacts rm forgets each NAME@VERSION given: run, stage, explain and spawns no longer
find it, and a later push may store other bytes under it.

No session loses its capsule. A session runs the stored tree its digest names (inspect shows
it as capsule.dir), not the name, and that tree is kept while any session, staged, live or
ended, records its digest. roostd deletes it at the first rm, prune, retention pass or
restart after no session records it any more.

Each NAME@VERSION is tried in turn. One that was never pushed (or was removed already), or is
not a name@version, is reported on stderr and the others are still removed; the exit code is
then 1. --json prints a JSON array of the artifacts removed.`,
		Example: `  roostctl artifacts rm worker@0.1.0
  roostctl artifacts rm worker@0.1.0 worker@0.2.0 --json`,
		Args: minArgs(1, "one or more NAME@VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := a.connect()
			if err != nil {
				return err
			}
			c := roostv1.NewArtifactServiceClient(conn)
			removed := []*roostv1.Artifact{}
			failed := 0
			for _, ref := range args {
				resp, err := c.RemoveArtifact(cmd.Context(), &roostv1.RemoveArtifactRequest{Ref: ref})
				if err != nil {
					if status.Code(err) == codes.Unavailable {
						// No daemon: the others would fail the same way.
						return err
					}
					failed++
					fmt.Fprintf(cmd.ErrOrStderr(), "roostctl: artifacts rm %s: %s\n", ref, a.describe(err))
					continue
				}
				art := resp.GetArtifact()
				removed = append(removed, art)
				if !asJSON {
					fmt.Fprintf(cmd.OutOrStdout(), "removed %s@%s %s\n", art.GetName(), art.GetVersion(), art.GetSha256())
				}
			}
			if asJSON {
				if err := printJSONList(cmd.OutOrStdout(), removed); err != nil {
					return err
				}
			}
			if failed > 0 {
				// Each failure is said above.
				return withCode(exitFailure, nil)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of the artifacts removed")
	return cmd
}
