package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"roost.dev/roost/pkg/fleet/route"
	"roost.dev/roost/pkg/server"
	"roost.dev/roost/pkg/version"
)

var _ server.Router = (*route.Router)(nil)

// router is what the server's Route is: the router, or none (never a nil *route.Router,
// which as a Router would not be nil).
func (d *daemon) router() server.Router {
	if d.route == nil {
		return nil
	}
	return d.route
}

// placingOrNil is what the server's Placing is: the stager, or none.
func (d *daemon) placingOrNil() server.Placing {
	if d.placing == nil {
		return nil
	}
	return d.placing
}

// serve runs roostd: its parts assembled, the control socket, the gRPC server, the remote
// listener (when configured) and metrics over HTTP opened, and readiness told only once
// recovery is done and the socket listens.
// It serves until SIGTERM or SIGINT, then drains; or until the control API fails, which
// is roostd's error. Either way the daemon's parts are released on the way out.
func serve(o *options, log *slog.Logger, sm *serviceManager, stopping *time.Time) error {
	// A daemon already serving on the socket is said before anything is assembled (and
	// before this one claims anything of the host's).
	if served(o.socket) {
		return fmt.Errorf("--socket %s: another roostd is serving on it", o.socket)
	}
	d, err := assemble(o, log, sm)
	if err != nil {
		return err
	}
	defer d.close()

	lis, err := listen(o.socket, d.group)
	if err != nil {
		return err
	}
	defer os.Remove(o.socket)
	sm.status("starting: opening the control socket")
	srv := server.New(server.Config{Sessions: d.sessions, Artifacts: d.artifacts, Ledger: d.spend, Assess: d.assess, StateDir: d.stateDir, SessionTrees: d.trees, StartedAt: time.Now(), Logger: log,
		IDs:         d.pool,
		Limits:      d.control,
		Descriptors: d.fds,
		Fleet:       d.fleet,
		Route:       d.router(),
		Placing:     d.placingOrNil(),
		Peers:       &server.PeerPolicy{Group: d.group, Sessions: server.NewSessionProcs(d.init, d.cgs.Parents())}})

	rem, err := openRemote(o, d, srv, log)
	if err != nil {
		lis.Close()
		return err
	}
	if rem != nil {
		defer rem.Close()
	}

	var metricsSrv *http.Server
	if o.metricsAddr != "" {
		mlis, err := net.Listen("tcp", o.metricsAddr)
		if err != nil {
			lis.Close()
			return fmt.Errorf("--metrics-addr %s: %w", o.metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", d.mtr.Handler())
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = metricsSrv.Serve(mlis) }()
		log.Info("serving metrics", "addr", mlis.Addr().String())
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	served := make(chan error, 2)
	go func() { served <- srv.Serve(lis) }()
	if rem != nil {
		go func() {
			if err := rem.Serve(); err != nil {
				served <- fmt.Errorf("the remote listener on %s: %w", rem.Addr(), err)
			}
		}()
		log.Info("serving the control API over TCP", "addr", rem.Addr().String(), "client_ca", rem.CASubject(), "clients", len(d.remote.Clients))
	}
	// Recovery is done and the socket is listening (connections made from now on are
	// served): only now does health say SERVING and the service manager hear READY=1.
	srv.SetServing()
	log.Info("roostd serving", "socket", o.socket, "state_dir", d.stateDir, "version", version.Version, "strongest_class", d.catalog.Strongest().String())
	health := func(ctx context.Context) error {
		_, _, err := liveSessions(ctx, d.sessions)
		return err
	}
	running, paused, _ := liveSessions(context.Background(), d.sessions)
	sm.ready(servingStatus(running, paused), health)
	statusTicker := time.NewTicker(statusEvery)
	defer statusTicker.Stop()

	var sig os.Signal
	for {
		select {
		case sig = <-sigs:
			*stopping = time.Now()
		case err := <-served:
			*stopping = time.Now()
			srv.SetNotServing()
			return fmt.Errorf("the control API stopped serving: %w", err)
		case <-statusTicker.C:
			if sm.n == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), statusEvery)
			running, paused, err := liveSessions(ctx, d.sessions)
			cancel()
			if err == nil {
				sm.status(servingStatus(running, paused))
			}
			continue
		}
		break
	}
	drain(log, sm, sig, srv, rem, metricsSrv)
	return nil
}
