package records

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// CutsFile is where roostd notes the cuts of a session's output it has reported, so each is
// reported once, across restarts too.
const CutsFile = "logs.reported"

// Cut is the first time one stream's output was cut: by the cap (resources.log_max_bytes)
// or by a failed write (a full disk).
type Cut struct {
	Stream string
	// Failed: lost to a failed write rather than dropped by the cap.
	Failed bool
	// Detail says how much, for the session's events.
	Detail string
}

// NewCuts returns the cuts logs.json counts that CutsFile does not hold yet, and mark,
// which notes them there: call it once they are reported, so that a crash in between
// reports them again rather than never. Calls for one directory must not overlap.
func NewCuts(recordsDir string) (cuts []Cut, mark func() error, err error) {
	st, err := ReadLogStats(recordsDir)
	if err != nil {
		return nil, nil, err
	}
	path := filepath.Join(recordsDir, CutsFile)
	// The keys name the stream and the limit the session met ("stdout log_bytes").
	reported := map[string]bool{}
	if data, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(data, &reported)
	}
	for _, name := range []string{Stdout, Stderr} {
		ss := st.Stream(name)
		if cut := ss.DroppedBytes - ss.FailedBytes; cut > 0 && !reported[name+" log_bytes"] {
			cuts = append(cuts, Cut{Stream: name, Detail: fmt.Sprintf("%s past resources.log_max_bytes (%d): its first bytes and its newest are kept, %d of %d bytes dropped so far",
				name, st.MaxBytes, ss.DroppedBytes, ss.WrittenBytes)})
			reported[name+" log_bytes"] = true
		}
		if ss.FailedBytes > 0 && !reported[name+" disk_full"] {
			cuts = append(cuts, Cut{Stream: name, Failed: true, Detail: fmt.Sprintf("%s: %d bytes of output lost to failed writes in the records directory: %s", name, ss.FailedBytes, ss.WriteError)})
			reported[name+" disk_full"] = true
		}
	}
	if len(cuts) == 0 {
		return nil, nil, nil
	}
	return cuts, func() error {
		data, _ := json.Marshal(reported)
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			return err
		}
		return os.Rename(tmp, path)
	}, nil
}
