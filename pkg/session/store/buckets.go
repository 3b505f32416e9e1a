package store

import (
	"encoding/binary"

	bolt "go.etcd.io/bbolt"
)

// The registry's layout. Every bucket path lives in this file; a test compares the tree a
// fresh registry holds against this comment.
//
//	v1/                          schema bucket; key "version" = uvarint migration level
//	  events_compacted = {"through":N,"by":...,"at":...} JSON, once events have been compacted:
//	                     every event up to N is gone (see Tx.CompactEvents)
//	  sessions/
//	    <session id>/            one bucket per session
//	      state        = the state's name (kept apart so state scans read a few bytes)
//	      record       = the Record as JSON, without its state
//	      manifest     = capsule.yaml exactly as staged
//	      explanation  = the effective grants at staging (roost.v1.Explanation, protojson)
//	      task         = the task text a spawning parent gave (only when it gave one)
//	      labels       = the labels given at stage as a JSON object (only when there were any;
//	                     written once): a roostd from before labels ignores the key
//	  events/                    its bucket sequence is the last event's number
//	    <seq, 8 bytes big-endian> = an Event as JSON; dense from events_compacted.through+1
//	  ids/                       host uid/gid ranges held by sessions, until they are removed
//	    <first id, 4 bytes big-endian> = the id of the session holding first..first+65535
//	  names/                     session names (names.go); made with the first name given, not
//	                             by a migration: a roostd from before names ignores it
//	    <name> = the id of the session holding it, deleted with that session; an entry whose
//	             session is gone (removed by a roostd from before names) is stale: the name is free
var (
	bucketV1       = []byte("v1")
	keyVersion     = []byte("version")
	bucketSessions = []byte("sessions")
	bucketEvents   = []byte("events")
	bucketIDs      = []byte("ids")
	bucketNames    = []byte("names")
	keyCompaction  = []byte("events_compacted")

	keyState       = []byte("state")
	keyRecord      = []byte("record")
	keyManifest    = []byte("manifest")
	keyExplanation = []byte("explanation")
	keyTask        = []byte("task")
	keyLabels      = []byte("labels")
)

func getBucket(tx *bolt.Tx, keys ...[]byte) *bolt.Bucket {
	b := tx.Bucket(keys[0])
	for _, k := range keys[1:] {
		if b == nil {
			return nil
		}
		b = b.Bucket(k)
	}
	return b
}

func createBucketIfNotExists(tx *bolt.Tx, keys ...[]byte) (*bolt.Bucket, error) {
	b, err := tx.CreateBucketIfNotExists(keys[0])
	if err != nil {
		return nil, err
	}
	for _, k := range keys[1:] {
		if b, err = b.CreateBucketIfNotExists(k); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func sessionsBucket(tx *bolt.Tx) *bolt.Bucket { return getBucket(tx, bucketV1, bucketSessions) }

func sessionBucket(tx *bolt.Tx, id string) *bolt.Bucket {
	return getBucket(tx, bucketV1, bucketSessions, []byte(id))
}

func createSessionBucket(tx *bolt.Tx, id string) (*bolt.Bucket, error) {
	return sessionsBucket(tx).CreateBucket([]byte(id))
}

func eventsBucket(tx *bolt.Tx) *bolt.Bucket { return getBucket(tx, bucketV1, bucketEvents) }

func idsBucket(tx *bolt.Tx) *bolt.Bucket { return getBucket(tx, bucketV1, bucketIDs) }

func idKey(first uint32) []byte { return binary.BigEndian.AppendUint32(nil, first) }

func seqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}
