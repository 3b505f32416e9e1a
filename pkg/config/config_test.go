package config

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := `inference:
  upstreams:
    - name: openai
      format: openai
      url: https://api.openai.com
      api_key_file: /etc/roost/openai.key
`
	c, err := Parse([]byte(good), "roostd.yaml")
	if err != nil || len(c.Inference.Upstreams) != 1 || c.Inference.Upstreams[0].Format != "openai" {
		t.Fatalf("%+v %v", c, err)
	}
	if c, err := Parse(nil, "empty.yaml"); err != nil || len(c.Inference.Upstreams) != 0 {
		t.Fatalf("empty file: %v", err)
	}
	bad := map[string]string{
		"inference:\n  upstreams:\n    - name: a\n      formt: openai\n":                                 "field formt not found",
		strings.Replace(good, "format: openai", "format: gemini", 1):                                     "format: \"gemini\"",
		strings.Replace(good, "https://api.openai.com", "api", 1):                                        "url: \"api\"",
		strings.Replace(good, "/etc/roost/openai.key", "key", 1):                                         "api_key_file",
		good + "    - name: openai\n      format: openai\n      url: http://x\n      api_key_file: /k\n": "declared twice",
		"listen: x\n": "field listen not found",
	}
	for src, want := range bad {
		if _, err := Parse([]byte(src), "roostd.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want %q)", src, err, want)
		}
	}
}
