package cli

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"roost.dev/roost/pkg/remote/certs"
)

// clientNameRE is what a client's Common Name may be here: it names its files too.
var clientNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func certsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Make certificates for roostd's remote listener",
	}
	var serverNames, clients []string
	initCmd := &cobra.Command{
		Use:   "init DIR",
		Short: "Make a CA, a server and client certificates in DIR for a first try",
		Long: `init makes a new CA in DIR (ca.pem, ca-key.pem), a server certificate it signed for roostd's
remote listener (server.pem, server-key.pem) and one for each client (client.pem and
client-key.pem for the first, NAME.pem and NAME-key.pem for others): ECDSA P-256, valid
for a year, every key mode 0600. It replaces no file, and prints the roostd configuration
and the roostctl flags that use them.

Each --client is NAME or NAME:ROLE (operator, reader or node; operator when not said), NAME
being the certificate's Common Name, which roostd's remote.clients gives its role. A node's
certificate (NAME:node, NAME being its --node-name) is what that roostd presents to the
other nodes' listeners when it forwards a call (--fleet-node-cert, --fleet-node-key).`,
		Example: `  roostctl certs init /etc/roost/tls --server-name roost.example \
      --client ci-bot --client dashboard:reader`,
		Args: exactArgs(1, "the directory to write to"),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			plan := certs.Plan{Dir: dir, ServerNames: serverNames}
			var roles []string
			for i, c := range clients {
				name, role, _ := strings.Cut(c, ":")
				if role == "" {
					role = "operator"
				}
				switch {
				case !clientNameRE.MatchString(name):
					return usageError{fmt.Errorf("--client %q: a client's name is letters, digits and ._- (its certificate's Common Name, and its files' names)", c)}
				case role != "operator" && role != "reader" && role != "node":
					return usageError{fmt.Errorf("--client %q: role %q: expected operator, reader or node", c, role)}
				}
				cl := certs.Client{CommonName: name, Cert: name + ".pem", Key: name + "-key.pem"}
				if i == 0 {
					cl.Cert, cl.Key = "client.pem", "client-key.pem"
				}
				plan.Clients = append(plan.Clients, cl)
				roles = append(roles, role)
			}
			if err := certs.Init(plan); err != nil {
				return err
			}
			// The listener listens on the first address among the names, else on all.
			host := "0.0.0.0"
			for _, n := range serverNames {
				if net.ParseIP(n) != nil {
					host = n
					break
				}
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "Wrote a CA, a server certificate for %s and %d client certificates in %s.\n\n", strings.Join(serverNames, ", "), len(plan.Clients), dir)
			fmt.Fprintf(out, "roostd's configuration (--config, e.g. /etc/roost/roostd.yaml):\n\nremote:\n  listen: %s\n  tls_cert: %s\n  tls_key: %s\n  client_ca: %s\n  clients:\n",
				net.JoinHostPort(host, "7443"), filepath.Join(dir, certs.ServerFile), filepath.Join(dir, certs.ServerKeyFile), filepath.Join(dir, certs.CAFile))
			for i, c := range plan.Clients {
				fmt.Fprintf(out, "    - {common_name: %s, role: %s}\n", c.CommonName, roles[i])
			}
			first := plan.Clients[0]
			fmt.Fprintf(out, "\nroostctl, as %s:\n\n  roostctl --server https://%s --tls-ca %s --tls-cert %s --tls-key %s ps\n",
				first.CommonName, net.JoinHostPort(serverNames[0], "7443"), filepath.Join(dir, certs.CAFile), filepath.Join(dir, first.Cert), filepath.Join(dir, first.Key))
			return nil
		},
	}
	initCmd.Flags().StringArrayVar(&serverNames, "server-name", []string{"localhost", "127.0.0.1"}, "a DNS name or IP address of roostd's host, for the server certificate (repeatable)")
	initCmd.Flags().StringArrayVar(&clients, "client", []string{"roostctl"}, "a client certificate to make, NAME or NAME:ROLE (repeatable)")
	cmd.AddCommand(initCmd)
	return cmd
}
