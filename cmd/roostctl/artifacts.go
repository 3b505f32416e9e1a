package main

import (
	"fmt"
	"path/filepath"
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
pushed are refused: give them a new version.`,
		Args: exactArgs(1, "one DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			abs, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			conn, err := a.connect()
			if err != nil {
				return err
			}
			resp, err := roostv1.NewArtifactServiceClient(conn).Push(cmd.Context(), &roostv1.PushRequest{Path: abs})
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
		Short: "List pushed capsules",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
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
				fmt.Fprintf(tw, "%s@%s\t%s\t%d\t%s\t%s\n", a.GetName(), a.GetVersion(), strings.TrimPrefix(a.GetSha256(), "sha256:")[:16],
					a.GetFiles(), bytesIEC(a.GetBytes()), ago(a.GetPushedAt()))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}
