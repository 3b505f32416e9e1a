package endpoint

import "time"

// The tests of package endpoint_test shorten the servers' timeouts and the report interval
// to see them act within a test's time; roostd keeps the defaults.

// WithTimeouts replaces the servers' header, request and idle timeouts; a zero one keeps
// its default.
func WithTimeouts(readHeader, read, idle time.Duration) Option {
	return func(e *Endpoints) {
		if readHeader > 0 {
			e.readHeaderTimeout = readHeader
		}
		if read > 0 {
			e.readTimeout = read
		}
		if idle > 0 {
			e.idleTimeout = idle
		}
	}
}

// WithReportInterval sets the least time between two reports of one session's refused
// connections.
func WithReportInterval(d time.Duration) Option {
	return func(e *Endpoints) {
		if d > 0 {
			e.reportEvery = d
		}
	}
}
