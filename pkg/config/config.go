// Package config reads roostd's configuration file (roostd --config): settings too long for
// flags. It is strict: an unknown key or a bad value stops the daemon with its line.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"

	"go.yaml.in/yaml/v3"
)

// Config is the whole file.
type Config struct {
	Inference Inference `yaml:"inference"`
	Sessions  Sessions  `yaml:"sessions"`
	Env       Env       `yaml:"env"`
}

// Sessions is how roostd runs sessions' processes.
type Sessions struct {
	// AllowRoot names capsules whose sessions may run as host root when they are not
	// sealed (a sealed session's root is always a user namespace's). Everything else runs
	// as an unprivileged uid of its own.
	AllowRoot []string `yaml:"allow_root"`
	// IDs is the host uid/gid range sessions' ids are allocated from.
	IDs IDRange `yaml:"ids"`
	// HostPaths are host trees (toolchains outside /usr: /opt/…, rustup's, nvm's) a capsule
	// may ask to read with filesystem.host_read: bound read-only into a sealed root,
	// readable by a scoped session's Landlock rules.
	HostPaths []string `yaml:"host_paths"`
}

// IDRange is a block of host uids (and the same gids) that roostd owns: no user of the host
// may hold one. It is cut into Slots ranges of IDsPerSession ids, one per session.
type IDRange struct {
	// First is the range's first id; DefaultFirstID when 0.
	First uint32 `yaml:"first"`
	// Slots is how many sessions can hold a range at once; DefaultIDSlots when 0.
	Slots uint32 `yaml:"slots"`
}

// IDsPerSession is how many ids a session's range holds: a sealed session maps them to
// 0..65535 in its user namespace; a session of another class runs as the first.
const IDsPerSession = 65536

// DefaultFirstID and DefaultIDSlots place sessions in 0x70000000…0x7FFDFFFF, which the
// systemd UID/GID allocation table leaves unused: above nspawn's container ranges
// (0x00080000…0x6FFFFFFF), below the foreign range (0x7FFE0000…) and the ids that
// 32-bit-signed tools mishandle.
const (
	DefaultFirstID uint32 = 0x70000000
	DefaultIDSlots uint32 = (0x7FFE0000 - 0x70000000) / IDsPerSession
)

// Env is what reaches sessions from roostd's own environment.
type Env struct {
	// Passthrough lists the host variables a capsule's env.allow may draw; nothing else of
	// roostd's environment reaches a session, whatever the capsule asks.
	Passthrough []string `yaml:"passthrough"`
}

// Inference declares the model upstreams the inference gateway may forward to.
type Inference struct {
	Upstreams []Upstream `yaml:"upstreams"`
}

// Upstream is one model API.
type Upstream struct {
	Name       string `yaml:"name"`
	Format     string `yaml:"format"`
	URL        string `yaml:"url"`
	APIKeyFile string `yaml:"api_key_file"`
	// DefaultMaxOutputTokens is what a request that sets no output limit is admitted for
	// (DefaultMaxOutputTokens when 0).
	DefaultMaxOutputTokens int64 `yaml:"default_max_output_tokens"`
}

// DefaultMaxOutputTokens is the output a call without its own limit is admitted for.
const DefaultMaxOutputTokens = 4096

// The upstream formats.
const (
	FormatOpenAI    = "openai"
	FormatAnthropic = "anthropic"
)

var (
	nameRE        = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	capsuleNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	envNameRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

func (s *Sessions) check(file string) error {
	for i, n := range s.AllowRoot {
		if !capsuleNameRE.MatchString(n) {
			return fmt.Errorf("%s: sessions.allow_root[%d]: %q is not a capsule name ([a-z0-9][a-z0-9-]*)", file, i, n)
		}
	}
	for i, p := range s.HostPaths {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("%s: sessions.host_paths[%d]: %q: give a clean absolute path other than /", file, i, p)
		}
	}
	if s.IDs.First == 0 {
		s.IDs.First = DefaultFirstID
	}
	if s.IDs.Slots == 0 {
		s.IDs.Slots = DefaultIDSlots
	}
	// Below 65536 live the host's own users; the last id must stay below (uid_t)-1, which
	// means "no id", and 65534-style overflow ids.
	end := uint64(s.IDs.First) + uint64(s.IDs.Slots)*IDsPerSession
	switch {
	case s.IDs.First < IDsPerSession:
		return fmt.Errorf("%s: sessions.ids.first: %d: must be at least %d (the host's own users live below)", file, s.IDs.First, IDsPerSession)
	case end > 1<<32-1:
		return fmt.Errorf("%s: sessions.ids: %d slots of %d ids from %d pass the last uid (%d)", file, s.IDs.Slots, IDsPerSession, s.IDs.First, uint64(1<<32-2))
	}
	return nil
}

// Defaults is the configuration of a roostd started without --config.
func Defaults() *Config {
	c, _ := Parse(nil, "defaults")
	return c
}

// CheckSecrets refuses api_key_files other users may read or write: sessions run as
// unprivileged uids, and a key they can read is theirs.
func (c *Config) CheckSecrets() error {
	for i, u := range c.Inference.Upstreams {
		info, err := os.Stat(u.APIKeyFile)
		if err != nil {
			// A key missing now may be written later; calls fail until it is.
			continue
		}
		if perm := info.Mode().Perm(); perm&0o007 != 0 {
			return fmt.Errorf("inference.upstreams[%d].api_key_file %s: mode %04o lets other users (sessions among them) use the key: chmod 600 it", i, u.APIKeyFile, perm)
		}
	}
	return nil
}

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path)
}

// Parse reads and validates a configuration; file names it in errors.
func Parse(data []byte, file string) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c Config
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := c.Sessions.check(file); err != nil {
		return nil, err
	}
	for i, v := range c.Env.Passthrough {
		if !envNameRE.MatchString(v) {
			return nil, fmt.Errorf("%s: env.passthrough[%d]: %q is not a variable name", file, i, v)
		}
	}
	seen := map[string]bool{}
	for i, u := range c.Inference.Upstreams {
		at := fmt.Sprintf("%s: inference.upstreams[%d]", file, i)
		if !nameRE.MatchString(u.Name) {
			return nil, fmt.Errorf("%s.name: %q is not a name (letters, digits, '.', '_', '-')", at, u.Name)
		}
		if seen[u.Name] {
			return nil, fmt.Errorf("%s.name: %q is declared twice", at, u.Name)
		}
		seen[u.Name] = true
		if u.Format != FormatOpenAI && u.Format != FormatAnthropic {
			return nil, fmt.Errorf("%s.format: %q: expected openai or anthropic", at, u.Format)
		}
		if parsed, err := url.Parse(u.URL); err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
			return nil, fmt.Errorf("%s.url: %q: expected an http:// or https:// URL", at, u.URL)
		}
		if !filepath.IsAbs(u.APIKeyFile) {
			return nil, fmt.Errorf("%s.api_key_file: %q: expected an absolute path", at, u.APIKeyFile)
		}
		switch {
		case u.DefaultMaxOutputTokens < 0:
			return nil, fmt.Errorf("%s.default_max_output_tokens: %d: must be more than 0", at, u.DefaultMaxOutputTokens)
		case u.DefaultMaxOutputTokens == 0:
			c.Inference.Upstreams[i].DefaultMaxOutputTokens = DefaultMaxOutputTokens
		}
	}
	return &c, nil
}
