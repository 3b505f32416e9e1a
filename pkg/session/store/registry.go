package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"
)

// DBFile is the registry's file name inside the state directory.
const DBFile = "roost.db"

// lockTimeout is how long Open waits for another process's lock on the registry before it
// gives up: a second daemon on the same state dir must fail at once, not hang.
const lockTimeout = 200 * time.Millisecond

// ErrLocked means another process holds the registry.
var ErrLocked = errors.New("the registry is held by another process")

// Registry is the durable record of every session and every event. Each Update is one
// fsynced bbolt transaction; its events are returned only once it has committed.
type Registry struct {
	db *bolt.DB
}

// CheckFree says whether another process holds the registry at path (ErrLocked), without
// opening it: a daemon asks before it claims anything else of the host's.
func CheckFree(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil // none yet, or unreadable: OpenRegistry says which
	}
	defer f.Close()
	// bbolt holds an exclusive flock on its file while open.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("%s: %w: another roostd is using this state directory", path, ErrLocked)
	}
	return unix.Flock(int(f.Fd()), unix.LOCK_UN)
}

// OpenRegistry opens (creating when absent) and migrates the registry at path.
func OpenRegistry(path string) (*Registry, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("%s: %w: another roostd is using this state directory", path, ErrLocked)
		}
		return nil, fmt.Errorf("opening the registry %s: %w", path, err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, err
	}
	return &Registry{db: db}, nil
}

// Close closes the registry file.
func (r *Registry) Close() error { return r.db.Close() }

// SchemaVersion names the registry's layout and migration level, e.g. "v1.1".
func (r *Registry) SchemaVersion() string { return fmt.Sprintf("%s.%d", schemaVersion, dbVersion) }

// Size is how far into its file the registry has ever written (bbolt's high-water page,
// finer than the file's size, which bbolt grows in steps), and how much of that its pages
// hold now (the high water less its free pages).
func (r *Registry) Size() (written, inUse int64) {
	_ = r.db.View(func(tx *bolt.Tx) error { written = tx.Size(); return nil })
	st := r.db.Stats()
	return written, written - int64(st.FreePageN+st.PendingPageN)*int64(r.db.Info().PageSize)
}

// View runs fn in a read-only transaction.
func (r *Registry) View(fn func(*Tx) error) error {
	return r.db.View(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx}) })
}

// Update runs fn in one read-write transaction and returns the events it emitted once the
// transaction has committed. When fn fails nothing is written and no event exists. A commit
// the filesystem has no room for is rolled back whole (bbolt writes the new meta page last)
// and fails ResourceExhausted, naming the state directory and its free space.
func (r *Registry) Update(fn func(*Tx) error) ([]Event, error) {
	var events []Event
	err := r.db.Update(func(btx *bolt.Tx) error {
		tx := &Tx{tx: btx, writable: true}
		if err := fn(tx); err != nil {
			return err
		}
		events = tx.events
		return nil
	})
	if err != nil {
		if IsNoSpace(err) {
			return nil, NoSpaceError(filepath.Dir(r.db.Path()), fmt.Sprintf("writing the registry %s failed (%v); nothing of the change was recorded", r.db.Path(), err))
		}
		return nil, err
	}
	return events, nil
}

// Tx is one registry transaction.
type Tx struct {
	tx       *bolt.Tx
	writable bool
	events   []Event
}

func notFound(id string) error {
	return fmt.Errorf("no session %q: %w", id, errdefs.ErrNotFound)
}

// Get reads one session.
func (t *Tx) Get(id string) (*Record, error) {
	b := sessionBucket(t.tx, id)
	if b == nil {
		return nil, notFound(id)
	}
	return readRecord(id, b)
}

func readRecord(id string, b *bolt.Bucket) (*Record, error) {
	rec := &Record{}
	if err := json.Unmarshal(b.Get(keyRecord), rec); err != nil {
		return nil, fmt.Errorf("session %s: record is unreadable: %v: %w", id, err, errdefs.ErrDataLoss)
	}
	rec.State = State(b.Get(keyState))
	labels, err := readLabels(id, b)
	rec.Labels = labels
	return rec, err
}

// readLabels reads a session's labels; nil when it has none (and for every session staged
// before labels).
func readLabels(id string, b *bolt.Bucket) (map[string]string, error) {
	v := b.Get(keyLabels)
	if v == nil {
		return nil, nil
	}
	var labels map[string]string
	if err := json.Unmarshal(v, &labels); err != nil {
		return nil, fmt.Errorf("session %s: labels are unreadable: %v: %w", id, err, errdefs.ErrDataLoss)
	}
	return labels, nil
}

// List reads every session whose state passes keep (every session when keep is nil) and
// whose labels match every selector, in id order, which is creation order.
func (t *Tx) List(keep func(State) bool, sels ...Selector) ([]*Record, error) {
	var out []*Record
	err := sessionsBucket(t.tx).ForEachBucket(func(k []byte) error {
		b := sessionsBucket(t.tx).Bucket(k)
		if keep != nil && !keep(State(b.Get(keyState))) {
			return nil
		}
		if len(sels) > 0 {
			// The labels alone first (their own key): most records a selector reads, it
			// passes over.
			labels, err := readLabels(string(k), b)
			if err != nil {
				return err
			}
			if !MatchLabels(labels, sels) {
				return nil
			}
		}
		rec, err := readRecord(string(k), b)
		if err != nil {
			return err
		}
		out = append(out, rec)
		return nil
	})
	return out, err
}

// CountByState counts sessions in each state, reading only their state keys.
func (t *Tx) CountByState() map[State]int {
	counts := map[State]int{}
	sessions := sessionsBucket(t.tx)
	_ = sessions.ForEachBucket(func(k []byte) error {
		counts[State(sessions.Bucket(k).Get(keyState))]++
		return nil
	})
	return counts
}

// States maps every session the registry holds to its state, reading a few bytes each.
func (t *Tx) States() map[string]State {
	out := map[string]State{}
	sessions := sessionsBucket(t.tx)
	_ = sessions.ForEachBucket(func(k []byte) error {
		out[string(k)] = State(sessions.Bucket(k).Get(keyState))
		return nil
	})
	return out
}

// Manifest returns the capsule.yaml a session was staged with.
func (t *Tx) Manifest(id string) ([]byte, error) { return t.blob(id, keyManifest) }

// Explanation returns the effective grants recorded when the session was staged.
func (t *Tx) Explanation(id string) ([]byte, error) { return t.blob(id, keyExplanation) }

func (t *Tx) blob(id string, key []byte) ([]byte, error) {
	b := sessionBucket(t.tx, id)
	if b == nil {
		return nil, notFound(id)
	}
	// bbolt's slices are valid only inside the transaction.
	return slices.Clone(b.Get(key)), nil
}

// Task returns the task text a session was staged with; nil when none.
func (t *Tx) Task(id string) ([]byte, error) { return t.blob(id, keyTask) }

// Create records a new session in state staged.
func (t *Tx) Create(rec *Record, manifest, explanation []byte) error {
	return t.CreateWithTask(rec, manifest, explanation, nil)
}

// CreateWithTask is Create for a session that comes with a task text.
func (t *Tx) CreateWithTask(rec *Record, manifest, explanation, task []byte) error {
	if err := transition(rec, Staged); err != nil {
		return err
	}
	b, err := createSessionBucket(t.tx, rec.ID)
	if err != nil {
		if errors.Is(err, bolterrors.ErrBucketExists) {
			return fmt.Errorf("session %q: %w", rec.ID, errdefs.ErrAlreadyExists)
		}
		return err
	}
	if err := t.claimName(rec); err != nil {
		return err
	}
	if err := CheckLabels(rec.Labels); err != nil {
		return err
	}
	blobs := map[string][]byte{string(keyManifest): manifest, string(keyExplanation): explanation}
	if task != nil {
		blobs[string(keyTask)] = task
	}
	// Written once: labels never change, so no later write of the record touches them.
	if len(rec.Labels) > 0 {
		data, err := json.Marshal(rec.Labels)
		if err != nil {
			return err
		}
		blobs[string(keyLabels)] = data
	}
	for k, v := range blobs {
		if err := b.Put([]byte(k), v); err != nil {
			return err
		}
	}
	return t.write(rec, b, EventStaged)
}

// Transition moves a session to a new state, saving every change made to rec, and emits the
// event that names the move. Illegal moves are refused (see transition.go).
func (t *Tx) Transition(rec *Record, to State) error {
	b := sessionBucket(t.tx, rec.ID)
	if b == nil {
		return notFound(rec.ID)
	}
	if stored := State(b.Get(keyState)); stored != rec.State {
		return fmt.Errorf("session %s changed underneath (%s, not %s): %w", rec.ID, stored, rec.State, errdefs.ErrConflict)
	}
	if err := transition(rec, to); err != nil {
		return err
	}
	return t.write(rec, b, eventFor(to))
}

// Save writes changes to a session that leave its state alone; no event.
func (t *Tx) Save(rec *Record) error {
	b := sessionBucket(t.tx, rec.ID)
	if b == nil {
		return notFound(rec.ID)
	}
	if stored := State(b.Get(keyState)); stored != rec.State {
		return fmt.Errorf("session %s changed underneath (%s, not %s): %w", rec.ID, stored, rec.State, errdefs.ErrConflict)
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return b.Put(keyRecord, data)
}

// Note records an event about a session that changes nothing in it (e.g. its recovery).
func (t *Tx) Note(rec *Record, eventType, detail string) error {
	if sessionBucket(t.tx, rec.ID) == nil {
		return notFound(rec.ID)
	}
	return t.emit(Event{Type: eventType, SessionID: rec.ID, State: rec.State, Detail: detail})
}

// NoteDaemon records an event about no session: roostd's own (a stage hook's judgement of a
// capsule no session was recorded for).
func (t *Tx) NoteDaemon(eventType, detail string) error {
	return t.emit(Event{Type: eventType, Detail: detail})
}

// Delete forgets a session, and lets go of its id range; only a staged or ended one may go.
func (t *Tx) Delete(rec *Record) error {
	sessions := sessionsBucket(t.tx)
	if sessions.Bucket([]byte(rec.ID)) == nil {
		return notFound(rec.ID)
	}
	// A session removed while staged never ran on its range.
	ran := rec.State != Staged
	if err := transition(rec, removed); err != nil {
		return err
	}
	if err := sessions.DeleteBucket([]byte(rec.ID)); err != nil {
		return err
	}
	if err := t.releaseName(rec); err != nil {
		return err
	}
	if rec.IDs != nil {
		if err := t.letGo(rec.IDs.First, rec.ID, ran); err != nil {
			return err
		}
	}
	return t.emit(Event{Type: EventRemoved, SessionID: rec.ID})
}

func (t *Tx) write(rec *Record, b *bolt.Bucket, event string) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := b.Put(keyRecord, data); err != nil {
		return err
	}
	if err := b.Put(keyState, []byte(rec.State)); err != nil {
		return err
	}
	ev := Event{Type: event, SessionID: rec.ID, State: rec.State, ExitStatus: rec.ExitStatus, Detail: rec.Detail}
	if p := rec.Placement; event == EventStaged && p != nil && ev.Detail == "" {
		// The session's trace says where the fleet placed it, and why; its record keeps
		// every candidate.
		ev.Detail = fmt.Sprintf("placed on %s by %s: %s", p.Node, p.Entry, p.Reason)
	}
	if rec.ExitCode != nil {
		code := *rec.ExitCode
		ev.ExitCode = &code
	}
	return t.emit(ev)
}

func (t *Tx) emit(ev Event) error {
	events := eventsBucket(t.tx)
	seq, err := events.NextSequence()
	if err != nil {
		return err
	}
	ev.Seq = seq
	ev.Time = time.Now().UTC()
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if err := events.Put(seqKey(seq), data); err != nil {
		return err
	}
	t.events = append(t.events, ev)
	return nil
}

// EventsSince returns up to limit events with a sequence number above since, in order. When
// compaction has deleted events after since it fails with a *CompactedError rather than skip
// them.
func (t *Tx) EventsSince(since uint64, limit int) ([]Event, error) {
	if c := t.Compaction(); since < c.Through {
		return nil, &CompactedError{Since: since, Compaction: c, Last: t.LastSeq()}
	}
	var out []Event
	c := eventsBucket(t.tx).Cursor()
	for k, v := c.Seek(seqKey(since + 1)); k != nil && len(out) < limit; k, v = c.Next() {
		var ev Event
		if err := json.Unmarshal(v, &ev); err != nil {
			return nil, fmt.Errorf("event %d is unreadable: %v: %w", binary.BigEndian.Uint64(k), err, errdefs.ErrDataLoss)
		}
		out = append(out, ev)
	}
	return out, nil
}

// LastSeq is the sequence number of the newest event; 0 when there is none.
func (t *Tx) LastSeq() uint64 { return eventsBucket(t.tx).Sequence() }

// Compaction is how far the event log has been compacted: every event up to Through is gone,
// every later one is kept. Sequence numbers are never reused, so the log is always the dense
// run Through+1..LastSeq.
type Compaction struct {
	Through uint64 `json:"through"`
	// By names what removed the sessions whose events went, e.g. "roostd --retain-ended 100".
	By string    `json:"by,omitempty"`
	At time.Time `json:"at,omitzero"`
}

// Compaction reads the compaction mark; zero when no event has been compacted.
func (t *Tx) Compaction() Compaction {
	var c Compaction
	if v := getBucket(t.tx, bucketV1).Get(keyCompaction); v != nil {
		// A mark that does not parse still says events were compacted, not how far: keep
		// readers from replaying a log with a hole by taking it as far as it could be.
		if err := json.Unmarshal(v, &c); err != nil {
			c.Through = t.firstSeq() - 1
		}
	}
	return c
}

// firstSeq is the oldest event kept; LastSeq+1 when none is.
func (t *Tx) firstSeq() uint64 {
	if k, _ := eventsBucket(t.tx).Cursor().First(); k != nil {
		return binary.BigEndian.Uint64(k)
	}
	return t.LastSeq() + 1
}

// CompactEvents deletes, oldest first and at most batch of them, the events that precede
// every event of a session the registry still holds (so each is about a session that has
// been removed), and then, while more than keep remain, the oldest ones whatever they are
// about (keep 0: no such bound). It records how far the log now starts, and by what. It
// returns how many events it deleted; a caller compacting a long log calls it again, in a
// new transaction, until that is fewer than batch.
func (t *Tx) CompactEvents(keep uint64, by string, batch int) (int, error) {
	events, sessions := eventsBucket(t.tx), sessionsBucket(t.tx)
	last := events.Sequence()
	var doomed [][]byte
	c := events.Cursor()
	for k, v := c.First(); k != nil && len(doomed) < batch; k, v = c.Next() {
		seq := binary.BigEndian.Uint64(k)
		if keep == 0 || last-seq+1 <= keep {
			var ev struct {
				SessionID string `json:"session_id"`
			}
			// An unreadable event is left for its reader to report, and the window starts
			// at it.
			if err := json.Unmarshal(v, &ev); err != nil || sessions.Bucket([]byte(ev.SessionID)) != nil {
				break
			}
		}
		doomed = append(doomed, slices.Clone(k))
	}
	if len(doomed) == 0 {
		return 0, nil
	}
	for _, k := range doomed {
		if err := events.Delete(k); err != nil {
			return 0, err
		}
	}
	mark, err := json.Marshal(Compaction{Through: binary.BigEndian.Uint64(doomed[len(doomed)-1]), By: by, At: time.Now().UTC()})
	if err != nil {
		return 0, err
	}
	if err := getBucket(t.tx, bucketV1).Put(keyCompaction, mark); err != nil {
		return 0, err
	}
	return len(doomed), nil
}

// CompactedError is a read of events that compaction has deleted.
type CompactedError struct {
	// Since is where the reader asked to start; Last the newest event there is.
	Since, Last uint64
	Compaction
}

func (e *CompactedError) Error() string {
	by := ""
	if e.By != "" {
		by = fmt.Sprintf(" (by %s, with the sessions it removed)", e.By)
	}
	oldest := fmt.Sprintf("the oldest kept is %d", e.Through+1)
	if e.Last <= e.Through {
		oldest = fmt.Sprintf("none is kept; the next will be %d", e.Through+1)
	}
	return fmt.Sprintf("events before %d were compacted away%s; %s: use --since %d or later", e.Through+1, by, oldest, e.Through)
}

// Unwrap classes it: the reader must restart from the window, not retry.
func (e *CompactedError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// Event is one committed change to the registry.
type Event struct {
	Seq        uint64     `json:"seq"`
	Time       time.Time  `json:"time"`
	Type       string     `json:"type"`
	SessionID  string     `json:"session_id"`
	State      State      `json:"state,omitempty"`
	ExitStatus ExitStatus `json:"exit_status,omitempty"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Detail     string     `json:"detail,omitempty"`
}

// Event types.
const (
	EventStaged    = "session.staged"
	EventLaunching = "session.launching"
	EventRunning   = "session.running"
	EventPaused    = "session.paused"
	EventStopping  = "session.stopping"
	EventExited    = "session.exited"
	EventRemoved   = "session.removed"
	// EventRecovered: a restarted roostd reconciled the session; the detail says how
	// (attached, exited, lost).
	EventRecovered = "session.recovered"
	// EventExec records a command roostctl exec ran in a session: its start, or why it
	// could not start, and its end. The detail names the exec's id and its command.
	EventExec = "session.exec"
	// EventExecRefused records an exec the session's allowlist refused: the detail names
	// the file, the program that tried, why, and how many times.
	EventExecRefused = "session.exec_refused"
)

func eventFor(s State) string { return "session." + strings.ToLower(string(s)) }
