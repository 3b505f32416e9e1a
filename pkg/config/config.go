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

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

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
