package manifest

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
)

// The checks below each judge one value; decode.go attaches their errors to key paths.

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// semverRE is the regular expression semver.org gives for a version.
	semverRE   = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)
	upstreamRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
)

const (
	maxNameLen = 63
	// maxDeadlineSeconds keeps a deadline representable as a time.Duration.
	maxDeadlineSeconds = (1<<63 - 1) / 1_000_000_000
)

func checkName(s string) error {
	if !nameRE.MatchString(s) {
		return fmt.Errorf("%q is not a capsule name: lower-case letters, digits and '-', starting with a letter or digit", s)
	}
	if len(s) > maxNameLen {
		return fmt.Errorf("%q is %d characters; a capsule name has at most %d", s, len(s), maxNameLen)
	}
	return nil
}

func checkVersion(s string) error {
	if !semverRE.MatchString(s) {
		return fmt.Errorf("%q is not a semantic version (MAJOR.MINOR.PATCH, e.g. 0.1.0)", s)
	}
	return nil
}

func checkNoNUL(list []string) error {
	for _, s := range list {
		if strings.ContainsRune(s, 0) {
			return errors.New("must not contain a NUL byte")
		}
	}
	return nil
}

// checkRelative accepts a path relative to a directory that stays beneath it.
func checkRelative(s string) error {
	switch {
	case s == "":
		return errors.New("must not be empty")
	case strings.ContainsRune(s, 0):
		return errors.New("must not contain a NUL byte")
	case path.IsAbs(s):
		return fmt.Errorf("%q is absolute; give a path relative to the directory", s)
	}
	for _, part := range strings.Split(s, "/") {
		if part == ".." {
			return fmt.Errorf("%q climbs out with '..'; give a path beneath the directory", s)
		}
	}
	return nil
}

func checkScope(s string) error {
	if s == "" {
		return errors.New("is empty; leave the key out to grant the whole workdir")
	}
	return checkRelative(s)
}

// checkReadOnly accepts blank entries: lowering trims them away.
func checkReadOnly(s string) error {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	return checkRelative(strings.TrimSpace(s))
}

// checkHostPath accepts a host tree as filesystem.host_read names it: absolute, clean, not /.
func checkHostPath(s string) error {
	switch {
	case !path.IsAbs(s):
		return fmt.Errorf("%q: give an absolute path on the host", s)
	case path.Clean(s) != s:
		return fmt.Errorf("%q is not a clean absolute path (did you mean %q?)", s, path.Clean(s))
	case s == "/":
		return errors.New(`"/" is the whole host; name the tree the session needs`)
	}
	return nil
}

// ShellPresets are the toolchains shell.allow may name whole (see pkg/toolchain, which
// resolves them on the host).
var ShellPresets = []string{"@gcc", "@git", "@go", "@make", "@node", "@python", "@shell"}

func checkShellEntry(s string) error {
	switch {
	case s == "":
		return errors.New("must not be empty")
	case strings.ContainsRune(s, 0):
		return errors.New("must not contain a NUL byte")
	case strings.HasPrefix(s, "@"):
		if !slices.Contains(ShellPresets, s) {
			return fmt.Errorf("%q is not a preset (roost knows %s)", s, strings.Join(ShellPresets, ", "))
		}
		return nil
	case path.IsAbs(s):
		if path.Clean(s) != s {
			return fmt.Errorf("%q is not a clean absolute path (did you mean %q?)", s, path.Clean(s))
		}
		return nil
	case strings.Contains(s, "/"):
		return fmt.Errorf("%q: give a program name looked up on PATH, or an absolute path", s)
	}
	return nil
}

func checkEnvName(s string) error {
	if !envNameRE.MatchString(s) {
		return fmt.Errorf("%q is not a variable name (letters, digits and '_', not starting with a digit)", s)
	}
	if strings.HasPrefix(strings.ToUpper(s), "ROOST_") {
		return fmt.Errorf("%q: ROOST_* variables are set by roost and cannot be declared", s)
	}
	return nil
}

func checkEnvAllow(s string) error {
	if err := checkEnvName(s); err != nil {
		return err
	}
	if CredentialShaped(s) {
		return fmt.Errorf("%q looks like a credential; roost never passes credential-shaped host variables through (set it in env: if the capsule must have it)", s)
	}
	return nil
}

// credentialMarks are fragments that make a variable name look like it holds a secret.
var credentialMarks = []string{"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "APIKEY", "API_KEY",
	"PRIVATE", "ACCESS_KEY", "AUTH", "COOKIE", "SESSION_KEY", "WEBHOOK", "SIGNING"}

// credentialSuffixes end names that hold secrets: keys, personal access tokens, database
// connection strings (DSNs carry passwords), and *PWD spellings of passwords.
var credentialSuffixes = []string{"_KEY", "_PAT", "_DSN", "PWD"}

// CredentialShaped reports whether a host variable name looks like it carries a secret.
func CredentialShaped(name string) bool {
	up := strings.ToUpper(name)
	for _, mark := range credentialMarks {
		if strings.Contains(up, mark) {
			return true
		}
	}
	for _, suffix := range credentialSuffixes {
		if strings.HasSuffix(up, suffix) {
			return true
		}
	}
	return strings.HasPrefix(up, "AWS_")
}

// CredentialValue reports whether a variable's value carries a credential whatever its name:
// a URL with a user (and password) in it, as proxies, databases and git remotes take them
// (http://user:pass@proxy:3128, postgres://app:pw@db/app). Each field of a list counts.
func CredentialValue(value string) bool {
	for _, field := range strings.FieldsFunc(value, func(r rune) bool { return r == ',' || r == ';' || r == ' ' || r == '\t' }) {
		scheme, rest, ok := strings.Cut(field, "://")
		if !ok || scheme == "" {
			continue
		}
		authority, _, _ := strings.Cut(rest, "/")
		if strings.Contains(authority, "@") {
			return true
		}
	}
	return false
}

func checkUpstream(s string) error {
	if !upstreamRE.MatchString(s) {
		return fmt.Errorf("%q is not an upstream name (letters, digits, '.', '_' and '-')", s)
	}
	return nil
}

func checkSystem(s string) error {
	if s != SystemAllowlist && s != SystemFull {
		return fmt.Errorf("%q: expected %q (the system trees hold what the allowlist needs) or %q (all of them, which the ELF loader can run)", s, SystemAllowlist, SystemFull)
	}
	return nil
}

func checkOnExhausted(s string) error {
	if s != OnExhaustedFail && s != OnExhaustedWait {
		return fmt.Errorf("%q: expected %q or %q", s, OnExhaustedFail, OnExhaustedWait)
	}
	return nil
}

func checkNetworkEntry(s string) error {
	_, err := ParseNetRule(s)
	return err
}
