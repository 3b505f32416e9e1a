package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// File is the fleet's file in the state directory: the blocks this node holds and the
// writes to the store it has begun but not seen decided. pkg/ledger's file is its own.
const File = "fleet.db"

// The file:
//
//	v1/
//	  intents/        <block id> = an intent as JSON: a grant or a return sent, or about to
//	                  be, whose outcome is not known yet
//	  blocks/<day>/   <block id> = a block this node holds (heldBlock as JSON)
var (
	bucketRoot    = []byte("v1")
	bucketIntents = []byte("intents")
	bucketBlocks  = []byte("blocks")
)

// Intent kinds.
const (
	intentGrant  = "grant"
	intentReturn = "return"
)

// intent is a write to the store made durable here before it is sent: after an ambiguous
// error or a restart, it is what the node finds out the outcome of, by reading the block.
type intent struct {
	Kind  string `json:"kind"`
	Day   string `json:"day"`
	Block string `json:"block"`
	// Tokens is the block's size (a grant) or what is given back (a return).
	Tokens int64 `json:"tokens"`
	// Rev is the block's ModRevision the return was read at, and Returned what the block
	// has returned once it applies.
	Rev      int64 `json:"rev,omitempty"`
	Returned int64 `json:"returned,omitempty"`
}

// heldBlock is a block as its node keeps it.
type heldBlock struct {
	Tokens   int64 `json:"tokens"`
	Returned int64 `json:"returned,omitempty"`
	// WrittenOff is set when the node found the block written off: it gives nothing more
	// back of it.
	WrittenOff bool `json:"written_off,omitempty"`
}

func (b heldBlock) left() int64 { return b.Tokens - b.Returned }

type local struct {
	db *bolt.DB
	// blocks and intents mirror the file; only the node's worker changes them.
	blocks  map[string]map[string]heldBlock
	intents map[string]intent
}

func openLocal(path string) (*local, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("%s: held by another process", path)
		}
		return nil, fmt.Errorf("opening the fleet file %s: %w", path, err)
	}
	l := &local{db: db, blocks: map[string]map[string]heldBlock{}, intents: map[string]intent{}}
	err = db.Update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(bucketRoot)
		if err != nil {
			return err
		}
		intents, err := root.CreateBucketIfNotExists(bucketIntents)
		if err != nil {
			return err
		}
		blocks, err := root.CreateBucketIfNotExists(bucketBlocks)
		if err != nil {
			return err
		}
		err = intents.ForEach(func(k, v []byte) error {
			var in intent
			if err := json.Unmarshal(v, &in); err != nil {
				return fmt.Errorf("fleet intent %s: %w", k, err)
			}
			l.intents[string(k)] = in
			return nil
		})
		if err != nil {
			return err
		}
		return blocks.ForEach(func(day, _ []byte) error {
			l.blocks[string(day)] = map[string]heldBlock{}
			return blocks.Bucket(day).ForEach(func(k, v []byte) error {
				var b heldBlock
				if err := json.Unmarshal(v, &b); err != nil {
					return fmt.Errorf("fleet block %s/%s: %w", day, k, err)
				}
				l.blocks[string(day)][string(k)] = b
				return nil
			})
		})
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("reading the fleet file %s: %w", path, err)
	}
	return l, nil
}

func (l *local) close() error { return l.db.Close() }

// begin makes an intent durable (fsynced) before its write is sent.
func (l *local) begin(in intent) error {
	err := l.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRoot).Bucket(bucketIntents).Put([]byte(in.Block), encode(in))
	})
	if err != nil {
		return fmt.Errorf("keeping a fleet %s of block %s: %w", in.Kind, in.Block, err)
	}
	l.intents[in.Block] = in
	return nil
}

// settle ends an intent, recording the block as it now is (nil: not held).
func (l *local) settle(in intent, b *heldBlock) error {
	err := l.db.Update(func(tx *bolt.Tx) error {
		root := tx.Bucket(bucketRoot)
		if err := root.Bucket(bucketIntents).Delete([]byte(in.Block)); err != nil {
			return err
		}
		if b == nil {
			return nil
		}
		day, err := root.Bucket(bucketBlocks).CreateBucketIfNotExists([]byte(in.Day))
		if err != nil {
			return err
		}
		return day.Put([]byte(in.Block), encode(b))
	})
	if err != nil {
		return fmt.Errorf("recording the fleet %s of block %s: %w", in.Kind, in.Block, err)
	}
	delete(l.intents, in.Block)
	if b != nil {
		if l.blocks[in.Day] == nil {
			l.blocks[in.Day] = map[string]heldBlock{}
		}
		l.blocks[in.Day][in.Block] = *b
	}
	return nil
}

// put records a block as it now is, outside an intent.
func (l *local) put(day, id string, b heldBlock) error {
	return l.settle(intent{Kind: "record", Day: day, Block: id}, &b)
}

// drop forgets a past day once nothing more can come of its blocks.
func (l *local) drop(day string) error {
	err := l.db.Update(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketRoot).Bucket(bucketBlocks).DeleteBucket([]byte(day))
		if errors.Is(err, bolterrors.ErrBucketNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("forgetting the fleet blocks of %s: %w", day, err)
	}
	delete(l.blocks, day)
	return nil
}

// held is what the node holds of day: its blocks' tokens less what they gave back, less
// what returns under way give back.
func (l *local) held(day string) int64 {
	var n int64
	for _, b := range l.blocks[day] {
		n += b.left()
	}
	for _, in := range l.intents {
		if in.Kind == intentReturn && in.Day == day {
			n -= in.Tokens
		}
	}
	return n
}

func (l *local) days() []string { return slices.Sorted(maps.Keys(l.blocks)) }
