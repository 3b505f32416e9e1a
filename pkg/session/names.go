package session

import (
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
)

// Session names: what an operator gives `run|stage --name`, so that a session can be
// addressed by something memorable rather than its id.
//
// A name is 1 to MaxNameLen bytes of [a-z0-9][a-z0-9_.-]*, not beginning with "ses_" (every
// session id does: a name that looked like an id would shadow it in resolve). It is unique
// among the sessions the registry holds, enforced by the names index (buckets.go) that
// CreateWithTask and Delete keep in the same transaction as the record, so a name frees up
// exactly when its session is removed (rm, prune, retention).

// MaxNameLen is the longest name, in bytes.
const MaxNameLen = 64

// idPrefix begins every session id; names may not begin with it.
const idPrefix = "ses_"

// nameRule is the rule as error messages state it.
const nameRule = `[a-z0-9][a-z0-9_.-]*, at most 64 bytes, not beginning with "ses_"`

// ValidName says why name cannot name a session (InvalidArgument), or nil when it can.
func ValidName(name string) error {
	bad := func(why string) error {
		return fmt.Errorf("name %q: %s; a session name is %s: %w", name, why, nameRule, errdefs.ErrInvalidArgument)
	}
	switch {
	case name == "":
		return bad("empty")
	case len(name) > MaxNameLen:
		return bad(fmt.Sprintf("%d bytes long", len(name)))
	case strings.HasPrefix(name, idPrefix):
		return bad(`it begins with "ses_", as session ids do`)
	}
	for i := range len(name) {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == '-'):
		case i == 0:
			return bad(fmt.Sprintf("it begins with %q", c))
		default:
			return bad(fmt.Sprintf("%q at byte %d is not allowed", c, i))
		}
	}
	return nil
}

// NameHolder returns the id of the session holding name; "" when no session the registry
// holds has it.
func (t *Tx) NameHolder(name string) string {
	b := getBucket(t.tx, bucketV1, bucketNames)
	if b == nil {
		return ""
	}
	id := string(b.Get([]byte(name)))
	// An entry whose session is gone is stale (written by a roostd that removed a named
	// session without knowing the index); the name is free.
	if id == "" || sessionBucket(t.tx, id) == nil {
		return ""
	}
	return id
}

// claimName gives rec.Name to rec in the index, refusing a name another session holds
// (AlreadyExists, naming that session). Called by CreateWithTask, in the record's
// transaction.
func (t *Tx) claimName(rec *Record) error {
	if rec.Name == "" {
		return nil
	}
	if err := ValidName(rec.Name); err != nil {
		return err
	}
	if err := t.nameFree(rec.Name, rec.ID); err != nil {
		return err
	}
	// Made with the first name, not by a migration: a registry no session was ever named
	// in holds the very layout it held before names.
	b, err := createBucketIfNotExists(t.tx, bucketV1, bucketNames)
	if err != nil {
		return err
	}
	return b.Put([]byte(rec.Name), []byte(rec.ID))
}

// releaseName frees rec's name when rec holds it; called by Delete, in the transaction that
// forgets the session.
func (t *Tx) releaseName(rec *Record) error {
	if rec.Name == "" {
		return nil
	}
	b := getBucket(t.tx, bucketV1, bucketNames)
	if b == nil || string(b.Get([]byte(rec.Name))) != rec.ID {
		return nil
	}
	return b.Delete([]byte(rec.Name))
}

// nameFree refuses name when a session other than self holds it (AlreadyExists, naming
// the holder and how to free the name).
func (t *Tx) nameFree(name, self string) error {
	holder := t.NameHolder(name)
	if holder == "" || holder == self {
		return nil
	}
	state := State(sessionBucket(t.tx, holder).Get(keyState))
	return fmt.Errorf("name %q is taken by session %s (%s); names free up when their session is removed (roostctl rm %s), or choose another: %w",
		name, holder, state, name, errdefs.ErrAlreadyExists)
}
