package main

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"time"

	"roost.dev/roost/pkg/remote"
	"roost.dev/roost/pkg/server"
)

// shutdownGrace bounds how long a stopping roostd waits for RPCs in flight (a stage, a
// wait) before it closes their connections.
const shutdownGrace = 2 * time.Second

// drain stops a roostd told to stop by sig. Sessions are left running under roost-init:
// the next roostd re-attaches them, so stopping the daemon must not stop its sessions.
// The rest of the stop follows when serve returns: its deferred calls (the status ticker,
// the signal handler, the control socket's file) and then the daemon's close.
func drain(log *slog.Logger, sm *serviceManager, sig os.Signal, srv *server.Server, rem *remote.Server, metricsSrv *http.Server) {
	log.Info("shutting down; sessions keep running", "signal", sig.String())
	sm.stopping("stopping; sessions keep running")
	// The remote listener stops accepting first and its unary calls get their moment:
	// the gRPC server's stop closes its requests at once, as it cannot wait for them.
	if rem != nil {
		rem.Drain(shutdownGrace)
	}
	// Stop accepting; followers of logs and events end at once (Unavailable: they resume
	// against the next daemon), other RPCs get a moment to finish.
	srv.Shutdown(shutdownGrace)
	if rem != nil {
		rem.Close()
	}
	if metricsSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = metricsSrv.Shutdown(ctx)
		cancel()
	}
}

// close releases the daemon's parts, the last made first: the watchdog stops before the
// registry its check reads is closed; the session manager lets go of its sessions without
// touching them and closes the registry; then the hooks, the ledger, the artifact store
// and roost-sealer, each file closed cleanly for the next roostd to open. Releasing again
// does nothing.
func (d *daemon) close() {
	for i := len(d.release) - 1; i >= 0; i-- {
		d.release[i]()
	}
	d.release = nil
}
