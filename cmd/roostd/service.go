package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"roost.dev/roost/pkg/session/store"

	"roost.dev/roost/pkg/notify"
	"roost.dev/roost/pkg/session"
)

// serviceManager is roostd's side of the service manager's notification protocol
// (Type=notify, WatchdogSec= in deploy/systemd/roostd.service). Without $NOTIFY_SOCKET
// every call does nothing.
type serviceManager struct {
	n   *notify.Notifier
	log *slog.Logger
	// watchdog is the service manager's watchdog timeout; 0 for none.
	watchdog time.Duration

	mu         sync.Mutex
	lastStatus string
	failed     bool
	// healthy is what the watchdog asks; nil while the daemon starts (the start-up is bounded
	// by TimeoutStartSec, not by the watchdog).
	healthy        func(context.Context) error
	cancelWatchdog context.CancelFunc
}

// newServiceManager reads what the service manager set in roostd's environment and removes
// it: no session, helper or hook roostd starts inherits $NOTIFY_SOCKET or $WATCHDOG_*.
func newServiceManager(log *slog.Logger) *serviceManager {
	s := &serviceManager{log: log}
	n, err := notify.FromEnv(true)
	if err != nil {
		log.Warn("not notifying the service manager", "err", err)
	}
	s.n = n
	wd, err := notify.WatchdogInterval(true)
	if err != nil {
		log.Warn("not answering the service manager's watchdog", "err", err)
	}
	if n != nil {
		s.watchdog = wd
	}
	return s
}

// send sends assignments; the first failure is a warning, later ones are for debugging.
func (s *serviceManager) send(assignments ...string) {
	if s.n == nil {
		return
	}
	if err := s.n.Send(assignments...); err != nil {
		s.mu.Lock()
		first := !s.failed
		s.failed = true
		s.mu.Unlock()
		if first {
			s.log.Warn("notifying the service manager", "err", err)
		} else {
			s.log.Debug("notifying the service manager", "err", err)
		}
	}
}

// status sends STATUS=text when it differs from the last one sent.
func (s *serviceManager) status(text string) {
	if s.n == nil {
		return
	}
	s.mu.Lock()
	same := text == s.lastStatus
	s.lastStatus = text
	s.mu.Unlock()
	if !same {
		s.send(notify.Status(text))
	}
}

// ready says the daemon serves: recovery is done and the control socket answers.
func (s *serviceManager) ready(status string, healthy func(context.Context) error) {
	s.mu.Lock()
	s.lastStatus = status
	s.healthy = healthy
	s.mu.Unlock()
	s.send(notify.Ready, notify.Status(status))
}

// stopping says the daemon is shutting down, and stops the watchdog's pings.
func (s *serviceManager) stopping(status string) {
	s.mu.Lock()
	s.lastStatus = status
	s.mu.Unlock()
	s.stopWatchdog()
	s.send(notify.Stopping, notify.Status(status))
}

// stopWatchdog stops the watchdog's pings and checks: the daemon is going.
func (s *serviceManager) stopWatchdog() {
	s.mu.Lock()
	cancel := s.cancelWatchdog
	s.healthy = nil
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// startWatchdog pings the service manager's watchdog at half its timeout for as long as
// the daemon is healthy; during start-up, for as long as the process runs.
func (s *serviceManager) startWatchdog() {
	if s.n == nil || s.watchdog <= 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.cancelWatchdog = cancel
	s.mu.Unlock()
	s.log.Info("answering the service manager's watchdog", "timeout", s.watchdog.String(), "ping_every", (s.watchdog / 2).String())
	go s.n.RunWatchdog(ctx, s.watchdog, func(ctx context.Context) error {
		s.mu.Lock()
		healthy := s.healthy
		s.mu.Unlock()
		if healthy == nil {
			return nil
		}
		return healthy(ctx)
	}, s.log)
}

// close stops the watchdog and releases the socket.
func (s *serviceManager) close() {
	s.stopWatchdog()
	_ = s.n.Close()
}

// liveSessions reads the registry: how many sessions run and are paused. Its error is the
// daemon's health: a registry that cannot answer a read is a daemon that cannot serve.
func liveSessions(ctx context.Context, m *session.Manager) (running, paused int, err error) {
	type answer struct {
		recs []*store.Record
		err  error
	}
	c := make(chan answer, 1)
	go func() {
		recs, err := m.List(false)
		c <- answer{recs, err}
	}()
	select {
	case a := <-c:
		if a.err != nil {
			return 0, 0, fmt.Errorf("reading the session registry: %w", a.err)
		}
		for _, r := range a.recs {
			switch r.State {
			case store.Running:
				running++
			case store.Paused:
				paused++
			}
		}
		return running, paused, nil
	case <-ctx.Done():
		return 0, 0, fmt.Errorf("reading the session registry: no answer: %w", ctx.Err())
	}
}

// servingStatus is the STATUS line of a daemon that serves.
func servingStatus(running, paused int) string {
	s := fmt.Sprintf("serving; %d running session%s", running, plural(running))
	if paused > 0 {
		s += fmt.Sprintf(", %d paused", paused)
	}
	return s
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// statusEvery is how often a serving daemon's STATUS line is brought up to date.
const statusEvery = 5 * time.Second
