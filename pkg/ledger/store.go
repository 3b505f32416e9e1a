package ledger

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// The ledger's file, apart from the session registry so its fsyncs and batches are its own:
//
//	v1/
//	  meta/          schema = 1, machine_ceiling = uint64 (0: none), lifetime = uint64 tokens,
//	                 fleet_allowance = the node's fleet allowance as JSON (fleet mode)
//	  accounts/      <session id> = account as JSON (lifetime totals, ancestry, ceiling, latch)
//	  reservations/  <reservation id> = an open reservation as JSON
//	  requests/      <session id> 0x00 <request id> = reservation id (admission is idempotent)
//	  settled/       <reservation id> = its settlement as JSON (settlement is idempotent)
//	  days/<UTC date>/
//	    charged      = uint64 tokens charged that day
//	    funded       = uint64 tokens charged to reservations that day's fleet allowance admitted
//	    sessions/    <session id> = uint64
//	    capsules/    <capsule name> = uint64
//
// Only this file reads or writes these buckets.
var (
	bucketRoot         = []byte("v1")
	bucketMeta         = []byte("meta")
	bucketAccounts     = []byte("accounts")
	bucketReservations = []byte("reservations")
	bucketRequests     = []byte("requests")
	bucketSettled      = []byte("settled")
	bucketDays         = []byte("days")
	bucketSessions     = []byte("sessions")
	bucketCapsules     = []byte("capsules")

	keySchema         = []byte("schema")
	keyMachineCeiling = []byte("machine_ceiling")
	keyLifetime       = []byte("lifetime")
	keyCharged        = []byte("charged")
	keyFunded         = []byte("funded")
	keyAllowance      = []byte("fleet_allowance")
)

const schema = 1

// lockTimeout: a second daemon on the same state directory fails at once.
const lockTimeout = 200 * time.Millisecond

// ErrLocked means another process holds the ledger.
var ErrLocked = errors.New("the ledger is held by another process")

func openDB(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("%s: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("opening the ledger %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(bucketRoot)
		if err != nil {
			return err
		}
		for _, name := range [][]byte{bucketMeta, bucketAccounts, bucketReservations, bucketRequests, bucketSettled, bucketDays} {
			if _, err := root.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := root.Bucket(bucketMeta)
		if v := meta.Get(keySchema); v != nil && getUint(v) > schema {
			return fmt.Errorf("the ledger %s has schema %d; this roostd knows up to %d", path, getUint(v), schema)
		}
		return meta.Put(keySchema, putUint(schema))
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

func bucket(tx *bolt.Tx, name []byte) *bolt.Bucket { return tx.Bucket(bucketRoot).Bucket(name) }

func putUint(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func getUint(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func addUint(b *bolt.Bucket, key []byte, delta int64) error {
	return b.Put(key, putUint(uint64(int64(getUint(b.Get(key)))+delta)))
}

func requestKey(session, request string) []byte {
	return append(append([]byte(session), 0), request...)
}

// storedAccount is an account as the ledger file keeps it: what was charged, never what is
// reserved (that is rebuilt from the open reservations).
type storedAccount struct {
	Capsule   string   `json:"capsule"`
	Parent    string   `json:"parent,omitempty"`
	Ancestors []string `json:"ancestors,omitempty"`
	Ceiling   int64    `json:"ceiling,omitempty"`
	Input     int64    `json:"input_tokens"`
	Output    int64    `json:"output_tokens"`
	// Charged is everything charged to the session: settled usage plus reservations charged
	// in full (expired, or open when the session ended).
	Charged int64 `json:"charged"`
	// SubtreeCharged adds the charges of every descendant.
	SubtreeCharged int64     `json:"subtree_charged"`
	Latched        *Refusal  `json:"latched,omitempty"`
	Ended          bool      `json:"ended,omitempty"`
	Registered     time.Time `json:"registered"`
}

func getAccount(tx *bolt.Tx, id string) (*storedAccount, error) {
	raw := bucket(tx, bucketAccounts).Get([]byte(id))
	if raw == nil {
		return nil, nil
	}
	var a storedAccount
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, fmt.Errorf("ledger account %s: %w", id, err)
	}
	return &a, nil
}

func putAccount(tx *bolt.Tx, id string, a *storedAccount) error {
	raw, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return bucket(tx, bucketAccounts).Put([]byte(id), raw)
}

// storedReservation is an open reservation.
type storedReservation struct {
	Session   string    `json:"session"`
	RequestID string    `json:"request_id,omitempty"`
	Tokens    int64     `json:"tokens"`
	Model     string    `json:"model,omitempty"`
	Admitted  time.Time `json:"admitted"`
	Expires   time.Time `json:"expires"`
	// Funded is the day whose fleet allowance admitted it (fleet mode only).
	Funded string `json:"funded,omitempty"`
}

func putReservation(tx *bolt.Tx, id string, r *storedReservation) error {
	raw, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := bucket(tx, bucketReservations).Put([]byte(id), raw); err != nil {
		return err
	}
	if r.RequestID != "" {
		return bucket(tx, bucketRequests).Put(requestKey(r.Session, r.RequestID), []byte(id))
	}
	return nil
}

func forEachReservation(tx *bolt.Tx, fn func(id string, r *storedReservation) error) error {
	return bucket(tx, bucketReservations).ForEach(func(k, v []byte) error {
		var r storedReservation
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("ledger reservation %s: %w", k, err)
		}
		return fn(string(k), &r)
	})
}

func requestReservation(tx *bolt.Tx, session, request string) string {
	return string(bucket(tx, bucketRequests).Get(requestKey(session, request)))
}

func getSettlement(tx *bolt.Tx, id string) (*Settlement, error) {
	raw := bucket(tx, bucketSettled).Get([]byte(id))
	if raw == nil {
		return nil, nil
	}
	var s Settlement
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("ledger settlement %s: %w", id, err)
	}
	return &s, nil
}

// writeCharge records one reservation's charge: its settlement, the reservation gone, and
// the charge added to the session's and every ancestor's totals, to the machine's lifetime
// total and to the day's. A settlement already present means this charge committed before:
// nothing is added twice, whoever runs it again.
func writeCharge(tx *bolt.Tx, s *Settlement, ancestors []string) error {
	settled := bucket(tx, bucketSettled)
	if settled.Get([]byte(s.ReservationID)) != nil {
		return nil
	}
	raw, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := settled.Put([]byte(s.ReservationID), raw); err != nil {
		return err
	}
	if err := bucket(tx, bucketReservations).Delete([]byte(s.ReservationID)); err != nil {
		return err
	}
	a, err := getAccount(tx, s.SessionID)
	if err != nil {
		return err
	}
	if a == nil {
		return fmt.Errorf("ledger: no account for session %s", s.SessionID)
	}
	a.Input += s.InputTokens
	a.Output += s.OutputTokens
	a.Charged += s.Charged
	a.SubtreeCharged += s.Charged
	if err := putAccount(tx, s.SessionID, a); err != nil {
		return err
	}
	for _, id := range ancestors {
		anc, err := getAccount(tx, id)
		if err != nil {
			return err
		}
		if anc == nil {
			continue
		}
		anc.SubtreeCharged += s.Charged
		if err := putAccount(tx, id, anc); err != nil {
			return err
		}
	}
	if err := addUint(bucket(tx, bucketMeta), keyLifetime, s.Charged); err != nil {
		return err
	}
	day, err := bucket(tx, bucketDays).CreateBucketIfNotExists([]byte(s.Day))
	if err != nil {
		return err
	}
	if err := addUint(day, keyCharged, s.Charged); err != nil {
		return err
	}
	if s.Funded != "" {
		funded, err := bucket(tx, bucketDays).CreateBucketIfNotExists([]byte(s.Funded))
		if err != nil {
			return err
		}
		if err := addUint(funded, keyFunded, s.Charged); err != nil {
			return err
		}
	}
	sessions, err := day.CreateBucketIfNotExists(bucketSessions)
	if err != nil {
		return err
	}
	if err := addUint(sessions, []byte(s.SessionID), s.Charged); err != nil {
		return err
	}
	capsules, err := day.CreateBucketIfNotExists(bucketCapsules)
	if err != nil {
		return err
	}
	return addUint(capsules, []byte(s.Capsule), s.Charged)
}

func deleteSettlement(tx *bolt.Tx, s *Settlement) error {
	if s.RequestID != "" {
		if err := bucket(tx, bucketRequests).Delete(requestKey(s.SessionID, s.RequestID)); err != nil {
			return err
		}
	}
	return bucket(tx, bucketSettled).Delete([]byte(s.ReservationID))
}

// storedDay is one day's window as the file keeps it.
type storedDay struct {
	charged  int64
	sessions map[string]int64
	capsules map[string]int64
}

func getDay(tx *bolt.Tx, date string) storedDay {
	d := storedDay{sessions: map[string]int64{}, capsules: map[string]int64{}}
	b := bucket(tx, bucketDays).Bucket([]byte(date))
	if b == nil {
		return d
	}
	d.charged = int64(getUint(b.Get(keyCharged)))
	for name, into := range map[string]map[string]int64{string(bucketSessions): d.sessions, string(bucketCapsules): d.capsules} {
		if sub := b.Bucket([]byte(name)); sub != nil {
			_ = sub.ForEach(func(k, v []byte) error {
				into[string(k)] = int64(getUint(v))
				return nil
			})
		}
	}
	return d
}
