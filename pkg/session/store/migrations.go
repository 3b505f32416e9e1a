package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// schemaVersion names the top bucket; it changes only for a layout older code cannot read.
// Compatible additions bump the migration level instead.
const schemaVersion = "v1"

// migration brings the registry to one level. Migrations run in order inside one
// transaction at open, so a failure leaves the registry as it was.
type migration struct {
	schema  string
	version uint64
	migrate func(*bolt.Tx) error
}

var migrations = []migration{
	{schema: "v1", version: 1, migrate: func(tx *bolt.Tx) error {
		for _, path := range [][][]byte{{bucketV1, bucketSessions}, {bucketV1, bucketEvents}} {
			if _, err := createBucketIfNotExists(tx, path...); err != nil {
				return err
			}
		}
		return nil
	}},
	// Sessions run as host id ranges of their own; a registry from before holds none.
	{schema: "v1", version: 2, migrate: func(tx *bolt.Tx) error {
		_, err := createBucketIfNotExists(tx, bucketV1, bucketIDs)
		return err
	}},
}

// dbVersion is the level this build brings a registry to.
var dbVersion = migrations[len(migrations)-1].version

// errSkip rolls back a migration transaction that had nothing to do, sparing the commit's
// fsync.
var errSkip = errors.New("nothing to migrate")

func migrate(db *bolt.DB) error {
	err := db.Update(func(tx *bolt.Tx) error {
		var stored uint64
		if b := tx.Bucket(bucketV1); b != nil {
			if v := b.Get(keyVersion); v != nil {
				n, size := binary.Uvarint(v)
				if size <= 0 {
					return errors.New("registry version is unreadable")
				}
				stored = n
			}
		}
		if stored > dbVersion {
			return fmt.Errorf("the registry is at %s.%d, newer than this roostd understands (%s.%d): run a newer roostd", schemaVersion, stored, schemaVersion, dbVersion)
		}
		if stored == dbVersion {
			return errSkip
		}
		for _, m := range migrations {
			if m.version <= stored {
				continue
			}
			if err := m.migrate(tx); err != nil {
				return fmt.Errorf("migrating the registry to %s.%d: %w", m.schema, m.version, err)
			}
		}
		b, err := tx.CreateBucketIfNotExists(bucketV1)
		if err != nil {
			return err
		}
		return b.Put(keyVersion, binary.AppendUvarint(nil, dbVersion))
	})
	if errors.Is(err, errSkip) {
		return nil
	}
	return err
}
