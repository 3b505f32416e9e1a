package store

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/containerd/errdefs"
)

// Session labels: string pairs a client sets at stage (run|stage --label, or an SDK's
// metadata) to find its sessions again by (ListRequest.label). They are part of the record,
// set once with it and never changed.
//
// Keys are Kubernetes' label keys, so that what a platform already writes for its pods
// carries over: [PREFIX/]NAME, NAME 1 to 63 of [A-Za-z0-9._-] beginning and ending with a
// letter or digit, PREFIX a DNS subdomain of at most 253. Values have NAME's characters
// (or are empty) but may be 256 long, not 63: a platform's ids (a sha256 in hex is 64, a
// content digest with its algorithm 71) must fit whole. The characters exclude "," and
// "=", which the CLI's filters split on. Keys under roost.dev/ are reserved: roost may
// label sessions itself one day, and a client's label must never pass for one of roost's.

// The bounds of a session's labels.
const (
	MaxLabels          = 64
	MaxLabelBytes      = 16 << 10
	MaxLabelNameLen    = 63
	MaxLabelPrefixLen  = 253
	MaxLabelValueLen   = 256
	reservedLabelRealm = "roost.dev"
)

// The rules as error messages state them.
const (
	labelKeyRule   = "a label key is [PREFIX/]NAME: NAME 1 to 63 characters of [A-Za-z0-9._-] beginning and ending with a letter or digit, PREFIX a DNS subdomain (lowercase [a-z0-9-] labels joined by dots) of at most 253"
	labelValueRule = "a label value is empty, or at most 256 characters of [A-Za-z0-9._-] beginning and ending with a letter or digit"
)

// CheckLabels says why labels cannot be a session's (InvalidArgument, naming the first key
// in order that breaks a rule, and the rule), or nil when they can.
func CheckLabels(labels map[string]string) error {
	if n := len(labels); n > MaxLabels {
		return fmt.Errorf("%d labels: a session has at most %d: %w", n, MaxLabels, errdefs.ErrInvalidArgument)
	}
	size := 0
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if err := checkLabelKey(k); err != nil {
			return err
		}
		if prefix, _, ok := strings.Cut(k, "/"); ok && (prefix == reservedLabelRealm || strings.HasSuffix(prefix, "."+reservedLabelRealm)) {
			return fmt.Errorf("label %q: keys under %s/ are reserved for roost: %w", k, reservedLabelRealm, errdefs.ErrInvalidArgument)
		}
		if err := checkLabelValue(k, labels[k]); err != nil {
			return err
		}
		size += len(k) + len(labels[k])
	}
	if size > MaxLabelBytes {
		return fmt.Errorf("labels of %d bytes (keys and values together): a session's labels hold at most %d (16 KiB): %w", size, MaxLabelBytes, errdefs.ErrInvalidArgument)
	}
	return nil
}

func checkLabelKey(k string) error {
	bad := func(why string) error {
		return fmt.Errorf("label %q: %s; %s: %w", k, why, labelKeyRule, errdefs.ErrInvalidArgument)
	}
	name := k
	if i := strings.LastIndexByte(k, '/'); i >= 0 {
		prefix := k[:i]
		name = k[i+1:]
		if why := checkSubdomain(prefix); why != "" {
			return bad("its prefix " + why)
		}
	}
	if why := checkLabelName(name, MaxLabelNameLen); why != "" {
		return bad("its name " + why)
	}
	return nil
}

func checkLabelValue(k, v string) error {
	if v == "" {
		return nil
	}
	if why := checkLabelName(v, MaxLabelValueLen); why != "" {
		return fmt.Errorf("label %q: its value %s; %s: %w", k, why, labelValueRule, errdefs.ErrInvalidArgument)
	}
	return nil
}

// checkLabelName says what is wrong with s as a label's name (or value) of at most limit
// characters; "" when nothing is.
func checkLabelName(s string, limit int) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > limit:
		return fmt.Sprintf("is %d characters long", len(s))
	}
	for i := range len(s) {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.' || c == '_' || c == '-':
			if i == 0 {
				return fmt.Sprintf("begins with %q", c)
			}
			if i == len(s)-1 {
				return fmt.Sprintf("ends with %q", c)
			}
		default:
			r, _ := utf8.DecodeRuneInString(s[i:])
			return fmt.Sprintf("has %q at byte %d", r, i)
		}
	}
	return ""
}

// checkSubdomain says what is wrong with s as a DNS subdomain (RFC 1123, as Kubernetes
// reads a label key's prefix); "" when nothing is.
func checkSubdomain(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > MaxLabelPrefixLen:
		return fmt.Sprintf("is %d characters long", len(s))
	}
	for part := range strings.SplitSeq(s, ".") {
		if part == "" {
			return fmt.Sprintf("%q has an empty label", s)
		}
		if len(part) > 63 {
			return fmt.Sprintf("%q has a label of %d characters (at most 63)", s, len(part))
		}
		for i := range len(part) {
			c := part[i]
			switch {
			case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
			case c == '-' && i > 0 && i < len(part)-1:
			default:
				return fmt.Sprintf("%q has %q in its label %q", s, c, part)
			}
		}
	}
	return ""
}

// Selector is one label selector of a listing: "KEY=VALUE" (the label KEY has that value)
// or "KEY" (the session has a label KEY).
type Selector struct {
	Key   string
	Value string
	// Exists: the selector was "KEY", and matches whatever KEY's value is.
	Exists bool
}

// ParseSelector reads one selector (InvalidArgument, naming it and the rule, when its key
// or value is none a label could have).
func ParseSelector(s string) (Selector, error) {
	key, value, hasValue := strings.Cut(s, "=")
	if err := checkLabelKey(key); err != nil {
		return Selector{}, fmt.Errorf("label selector %q: %w", s, err)
	}
	if err := checkLabelValue(key, value); err != nil {
		return Selector{}, fmt.Errorf("label selector %q: %w", s, err)
	}
	return Selector{Key: key, Value: value, Exists: !hasValue}, nil
}

// ParseSelectors reads every selector of a listing.
func ParseSelectors(list []string) ([]Selector, error) {
	out := make([]Selector, 0, len(list))
	for _, s := range list {
		sel, err := ParseSelector(s)
		if err != nil {
			return nil, err
		}
		out = append(out, sel)
	}
	return out, nil
}

// MatchLabels reports whether labels satisfy every selector.
func MatchLabels(labels map[string]string, sels []Selector) bool {
	for _, s := range sels {
		v, ok := labels[s.Key]
		if !ok || !s.Exists && v != s.Value {
			return false
		}
	}
	return true
}
