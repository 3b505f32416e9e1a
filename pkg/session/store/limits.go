package store

// The bounds a session can meet, as events' details and the roost_limit_hits_total label.
const (
	LimitEndpointConnections = "endpoint_connections"
	LimitLogBytes            = "log_bytes"
	LimitWorkdirBytes        = "workdir_bytes"
	LimitWorkdirInodes       = "workdir_inodes"
	LimitChildrenTotal       = "children_total"
	LimitDiskFull            = "disk_full"
	LimitIDRanges            = "id_ranges"
)

// EventLimit is a session meeting one of its bounds: a refusal or a cut, with what it was.
const EventLimit = "session.limit"

// Limits lists every bound, so that each roost_limit_hits_total series exists, at zero,
// before its first hit: an alert on it then sees an increase, not a series appearing.
var Limits = []string{LimitEndpointConnections, LimitLogBytes, LimitWorkdirBytes, LimitWorkdirInodes,
	LimitChildrenTotal, LimitDiskFull, LimitIDRanges}
