package main

import (
	"log/slog"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/remote"
	"roost.dev/roost/pkg/server"
)

// remoteSettings are the remote listener's settings: each flag given overrides its key of
// the config's remote section, and each value says which it came from.
func remoteSettings(o *options, r config.Remote) (remote.Settings, error) {
	file := o.configFile
	if file == "" {
		file = "the configuration (no --config)"
	}
	pick := func(flag, fromFlag, key, fromFile string) remote.Setting {
		if fromFlag != "" {
			return remote.Setting{Value: fromFlag, From: "--" + flag}
		}
		return remote.Setting{Value: fromFile, From: file + ": remote." + key}
	}
	clients := make([]remote.Client, 0, len(r.Clients))
	for _, c := range r.Clients {
		clients = append(clients, remote.Client{CommonName: c.CommonName, Role: remote.Role(c.Role)})
	}
	rolesFrom := file + ": remote.clients"
	roles, err := remote.NewRoles(rolesFrom, clients)
	if err != nil {
		return remote.Settings{}, err
	}
	return remote.Settings{
		Listen:    pick("listen-tcp", o.listenTCP, "listen", r.Listen),
		Cert:      pick("tls-cert", o.tlsCert, "tls_cert", r.TLSCert),
		Key:       pick("tls-key", o.tlsKey, "tls_key", r.TLSKey),
		ClientCA:  pick("client-ca", o.clientCA, "client_ca", r.ClientCA),
		Roles:     roles,
		RolesFrom: rolesFrom,
	}, nil
}

// openRemote opens the remote listener in front of srv, or returns nil when none is
// configured.
func openRemote(o *options, d *daemon, srv *server.Server, log *slog.Logger) (*remote.Server, error) {
	s, err := remoteSettings(o, d.remote)
	if err != nil || !s.Enabled() {
		return nil, err
	}
	return remote.New(s, srv.Server, remote.Options{
		MaxMessageBytes: max(d.control.MaxRecvMessageBytes, d.control.MaxSendMessageBytes),
		MaxStreams:      d.control.MaxStreams,
	}, log)
}
