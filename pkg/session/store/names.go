package store

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
	if err := t.NameFree(rec.Name, rec.ID); err != nil {
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

// NameFree refuses name when a session other than self holds it (AlreadyExists, naming
// the holder and how to free the name).
func (t *Tx) NameFree(name, self string) error {
	holder := t.NameHolder(name)
	if holder == "" || holder == self {
		return nil
	}
	state := State(sessionBucket(t.tx, holder).Get(keyState))
	return fmt.Errorf("name %q is taken by session %s (%s); names free up when their session is removed (roostctl rm %s), or choose another: %w",
		name, holder, state, name, errdefs.ErrAlreadyExists)
}

// minPrefix is the shortest id prefix accepted in place of a whole id.
const minPrefix = len(idPrefix) + 4

// ShortIDLen is how many hex digits a short id has: the end of the id, which is random. The
// start is not: an id is a UUIDv7, whose first 12 digits are its creation time in
// milliseconds, so the ids of sessions staged the same minute share their first 8.
const ShortIDLen = 12

// minShortID is the fewest digits of a short id accepted in place of all of it: enough to
// be unique among a few hundred sessions, few enough to type.
const minShortID = 4

// maxCandidates bounds the sessions an ambiguity error lists.
const maxCandidates = 5

// ShortID is a session id's short id: its last ShortIDLen hex digits (the whole id when it
// has fewer after "ses_").
func ShortID(id string) string {
	if hex := strings.TrimPrefix(id, idPrefix); len(hex) > ShortIDLen {
		return hex[len(hex)-ShortIDLen:]
	}
	return id
}

// Resolve finds the session ref names. In order, the first kind that matches wins:
//
//  1. a session name, exactly;
//  2. a session id, exactly;
//  3. a prefix of one session's id: "ses_" and at least 4 more characters;
//  4. a short id: at least 4 and at most 12 hex digits that begin one session's short id,
//     or more than 12 that end one session's id (what ps shows when two short ids collide).
//
// Names never begin with "ses_" and ids always do, so 1 never shadows 2 or 3; a name made
// of hex digits does shadow the short ids it begins. A ref that matches several sessions at
// 3 or 4 is InvalidArgument, listing some of them.
func (tx *Tx) Resolve(ref string) (*Record, error) {
	if ref == "" {
		return nil, fmt.Errorf("no session given (a name, an id or a short id): %w", errdefs.ErrInvalidArgument)
	}
	if holder := tx.NameHolder(ref); holder != "" {
		return tx.Get(holder)
	}
	rec, err := tx.Get(ref)
	if err == nil || !errdefs.IsNotFound(err) {
		return rec, err
	}
	var match func(id string) bool
	var kind string
	switch {
	case strings.HasPrefix(ref, idPrefix) && len(ref) >= minPrefix:
		kind = "id prefix"
		match = func(id string) bool { return strings.HasPrefix(id, ref) }
	case isHex(ref) && len(ref) >= minShortID && len(ref) <= ShortIDLen:
		kind = "short id"
		match = func(id string) bool { return strings.HasPrefix(ShortID(id), ref) }
	case isHex(ref) && len(ref) > ShortIDLen:
		kind = "short id"
		match = func(id string) bool { return len(id) >= len(idPrefix)+len(ref) && strings.HasSuffix(id, ref) }
	default:
		return nil, fmt.Errorf("no session %q (no name or id is that; an id prefix is \"ses_\" and 4 or more characters, a short id 4 or more hex digits): %w", ref, errdefs.ErrNotFound)
	}
	var found []string
	_ = sessionsBucket(tx.tx).ForEachBucket(func(k []byte) error {
		if match(string(k)) {
			found = append(found, string(k))
		}
		return nil
	})
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("no session %q (no name, id or %s matches): %w", ref, kind, errdefs.ErrNotFound)
	case 1:
		return tx.Get(found[0])
	}
	list := make([]string, 0, maxCandidates+1)
	for _, id := range found[:min(len(found), maxCandidates)] {
		c := id
		if r, err := tx.Get(id); err == nil && r.Name != "" {
			c += " (" + r.Name + ")"
		}
		list = append(list, c)
	}
	if more := len(found) - maxCandidates; more > 0 {
		list = append(list, fmt.Sprintf("and %d more", more))
	}
	return nil, fmt.Errorf("%s %q is ambiguous: it matches %d sessions: %s; give more of it, or the full id: %w",
		kind, ref, len(found), strings.Join(list, ", "), errdefs.ErrInvalidArgument)
}

func isHex(s string) bool {
	for i := range len(s) {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return s != ""
}
