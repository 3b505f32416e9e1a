package config

import (
	"os"
	"path/filepath"
	"reflect"
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
	if c, err := Parse(nil, "empty.yaml"); err != nil || len(c.Inference.Upstreams) != 0 ||
		c.Inference.MaxBodyBytesInFlight != DefaultMaxBodyBytesInFlight || c.Inference.MaxCallsPerSession != DefaultMaxCallsPerSession {
		t.Fatalf("empty file: %+v %v", c, err)
	}
	if c, err := Parse([]byte("inference:\n  max_body_bytes_in_flight: 1048576\n  max_calls_per_session: 2\n"), "roostd.yaml"); err != nil ||
		c.Inference.MaxBodyBytesInFlight != 1<<20 || c.Inference.MaxCallsPerSession != 2 {
		t.Fatalf("the gateway's bounds: %+v %v", c, err)
	}
	bad := map[string]string{
		"inference:\n  upstreams:\n    - name: a\n      formt: openai\n":                                 "roostd.yaml:4: inference.upstreams[0].formt: unknown key (expected one of: api_key_file, default_max_output_tokens, format, models, name, routes, url)",
		strings.Replace(good, "format: openai", "format: gemini", 1):                                     "format: \"gemini\"",
		strings.Replace(good, "https://api.openai.com", "api", 1):                                        "url: \"api\"",
		strings.Replace(good, "/etc/roost/openai.key", "key", 1):                                         "api_key_file",
		good + "    - name: openai\n      format: openai\n      url: http://x\n      api_key_file: /k\n": "declared twice",
		"listen: x\n": "roostd.yaml:1: listen: unknown key (expected one of: control, egress, env, fleet, hooks, inference, remote, sessions)",
		"inference:\n  max_body_bytes_in_flight: -1\n": "inference.max_body_bytes_in_flight: -1: must be more than 0",
		"inference:\n  max_calls_per_session: -3\n":    "inference.max_calls_per_session: -3: must be more than 0",
		"inference:\n  max_calls_per_session: x\n":     `roostd.yaml:2: inference.max_calls_per_session: expected an integer, got "x"`,
	}
	for src, want := range bad {
		if _, err := Parse([]byte(src), "roostd.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want %q)", src, err, want)
		}
	}
}

// roostd's configuration is the operator's, but a typo in it must be a clear error, never a
// panic or a block of ids that wraps around.
func FuzzParse(f *testing.F) {
	f.Add([]byte("inference:\n  upstreams:\n    - name: a\n      format: openai\n      url: http://x\n      api_key_file: /k\n"))
	f.Add([]byte("sessions:\n  allow_root: [a, b]\n  ids:\n    first: 65536\n    slots: 2\nenv:\n  passthrough: [LANG]\n"))
	f.Add([]byte("sessions:\n  ids:\n    first: 4294901760\n    slots: 1\n"))
	f.Add([]byte("control:\n  max_streams: 8\n  max_streams_per_client: 9\n  stream_send_timeout_seconds: -1\n"))
	f.Add([]byte("sessions:\n  ids: &a\n    first: x\n  <<: *a\n"))
	f.Add([]byte("hooks:\n  - {name: a, on: stage}\n  - [b]\n---\n"))
	f.Add([]byte("egress:\n  hosts: {a: [1], b: 2}\n  permit_cidrs: [10.0.0.0/8\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz.yaml")
		if err != nil {
			// roostd prints it as its one line at start.
			if msg := err.Error(); !strings.HasPrefix(msg, "fuzz.yaml:") || strings.Contains(msg, "\n") {
				t.Fatalf("error is not one line naming the file: %q", msg)
			}
			return
		}
		ids := c.Sessions.IDs
		if ids.First < IDsPerSession || ids.Slots == 0 || uint64(ids.First)+uint64(ids.Slots)*IDsPerSession > 1<<32-1 {
			t.Fatalf("accepted an id block that does not fit: %+v", ids)
		}
	})
}

func TestSessionsAndEnv(t *testing.T) {
	c, err := Parse([]byte("sessions:\n  allow_root: [builder]\nenv:\n  passthrough: [LANG, TZ]\n"), "roostd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Sessions.IDs.First != DefaultFirstID || c.Sessions.IDs.Slots != DefaultIDSlots || c.Sessions.AllowRoot[0] != "builder" || len(c.Env.Passthrough) != 2 {
		t.Fatalf("%+v", c)
	}
	if c.Sessions.DescriptorsPerSession != 0 {
		t.Fatalf("descriptors_per_session unset: %d, want 0 (derived at start)", c.Sessions.DescriptorsPerSession)
	}
	if c, err := Parse([]byte("sessions:\n  descriptors_per_session: 200\n"), "roostd.yaml"); err != nil || c.Sessions.DescriptorsPerSession != 200 {
		t.Fatalf("descriptors_per_session: 200: %v %+v", err, c)
	}
	// Spawns leave the operator an eighth of the sessions' ranges; a tree takes at most 256.
	if c.Sessions.IDs.Spawns != 3582 || c.Sessions.IDs.PerTree != 256 {
		t.Fatalf("range bounds %+v", c.Sessions.IDs)
	}
	for src, want := range map[string]string{
		"sessions:\n  allow_root: [Not_A_Name]\n":           "sessions.allow_root[0]",
		"sessions:\n  ids:\n    first: 1000\n":              "sessions.ids.first: 1000",
		"sessions:\n  ids:\n    slots: 70000\n":             "pass the last uid",
		"sessions:\n  ids:\n    slots: 10\n    spawns: 9\n": "sessions.ids.spawns: 9: must be below the 9 ranges",
		"env:\n  passthrough: [\"A=B\"]\n":                  "env.passthrough[0]",
		"sessions:\n  alow_root: [x]\n":                     "roostd.yaml:2: sessions.alow_root: unknown key (expected one of: allow_root, descriptors_per_session, host_paths, ids)",
		"sessions:\n  descriptors_per_session: -1\n":        "sessions.descriptors_per_session: -1",
	} {
		if _, err := Parse([]byte(src), "roostd.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want %q)", src, err, want)
		}
	}
	key := filepath.Join(t.TempDir(), "k")
	os.WriteFile(key, []byte("sk"), 0o644)
	c, _ = Parse([]byte("inference:\n  upstreams:\n    - name: a\n      format: openai\n      url: http://x\n      api_key_file: "+key+"\n"), "roostd.yaml")
	if err := c.CheckSecrets(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable key file: %v", err)
	}
	os.Chmod(key, 0o640)
	if err := c.CheckSecrets(); err != nil {
		t.Fatalf("a key file only its group may read: %v", err)
	}
}

// An upstream's models list and declared routes: each route says whether it is metered
// (and then what a call is admitted for), may not repeat a built-in route or another, and
// has a clean path.
func TestUpstreamRoutes(t *testing.T) {
	head := "inference:\n  upstreams:\n    - name: openai\n      format: openai\n      url: https://api.openai.com\n      api_key_file: /k\n"
	good := head + `      models: [gpt-4o, gpt-4o-mini]
      routes:
        - {method: POST, path: v1/audio/speech, metered: false}
        - {method: POST, path: /v1/images/generations, metered: true, tokens: 5000}
        - {method: GET, path: "v1/files/{id}/content", metered: false, query: [limit]}
`
	c, err := Parse([]byte(good), "roostd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	u := c.Inference.Upstreams[0]
	if len(u.Models) != 2 || len(u.Routes) != 3 || u.Routes[1].Path != "v1/images/generations" || !*u.Routes[1].Metered || u.Routes[1].Tokens != 5000 || *u.Routes[0].Metered || u.Routes[2].Query[0] != "limit" {
		t.Fatalf("%+v", u)
	}
	route := func(r string) string { return head + "      routes:\n        - " + r + "\n" }
	for src, want := range map[string]string{
		route(`{method: POST, path: v1/audio/speech}`):                                                          "routes[0].metered: say whether",
		route(`{method: POST, path: v1/x, metered: true}`):                                                      "routes[0].tokens: 0: a metered route needs",
		route(`{method: POST, path: v1/x, metered: false, tokens: 5}`):                                          "routes[0].tokens: 5: an unmetered route",
		route(`{method: post, path: v1/x, metered: false}`):                                                     `routes[0].method: "post"`,
		route(`{method: HEAD, path: v1/x, metered: false}`):                                                     `routes[0].method: "HEAD"`,
		route(`{method: POST, path: "v1/../admin", metered: false}`):                                            `segment ".."`,
		route(`{method: POST, path: "v1//x", metered: false}`):                                                  `segment ""`,
		route(`{method: POST, path: "v1/a%2fb", metered: false}`):                                               `segment "a%2fb"`,
		route(`{method: POST, path: "v1\\x", metered: false}`):                                                  `segment "v1\\x"`,
		route(`{method: POST, path: "", metered: false}`):                                                       "routes[0].path: a route's path is required",
		route(`{method: POST, path: v1/chat/completions, metered: false}`):                                      "POST v1/chat/completions is built in",
		route(`{method: GET, path: "v1/models/{model}", metered: false}`):                                       "GET v1/models/{model} is built in",
		route(`{method: GET, path: v1/x, metered: false, query: ["a=b"]}`):                                      `routes[0].query[0]: "a=b"`,
		route(`{method: GET, path: v1/x, metered: true, tokens: 1099511627777}`):                                "tokens: 1099511627777",
		route("{method: GET, path: v1/x, metered: false}\n        - {method: GET, path: v1/x, metered: false}"): "routes[1]: GET v1/x is built in or declared before",
		head + "      models: [a, a]\n":                                                                         `models[1]: "a" is listed twice`,
		head + "      models: [other]\n":                                                                        `models[0]: "other" is the label`,
		head + "      models: [\"\"]\n":                                                                         `models[0]: ""`,
		head + "      routes:\n        - {method: POST, path: v1/x, metred: false}\n":                           "roostd.yaml:8: inference.upstreams[0].routes[0].metred: unknown key (expected one of: metered, method, path, query, tokens)",
	} {
		if _, err := Parse([]byte(src), "roostd.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want %q)", src, err, want)
		}
	}
	// The same path under another method, or on the other format, is another route.
	if _, err := Parse([]byte(route(`{method: GET, path: v1/chat/completions, metered: false}`)), "roostd.yaml"); err != nil {
		t.Errorf("GET chat/completions: %v", err)
	}
	if _, err := Parse([]byte(strings.Replace(route(`{method: POST, path: v1/chat/completions, metered: false}`), "format: openai", "format: anthropic", 1)), "roostd.yaml"); err != nil {
		t.Errorf("chat/completions on anthropic: %v", err)
	}
}

func TestEgress(t *testing.T) {
	c, err := Parse([]byte(`egress:
  hosts:
    Git.Internal.Test.: 10.213.0.2
    v6.test: "::ffff:10.213.0.3"
  permit_cidrs: [10.213.0.0/24, "fd00::/8"]
`), "roostd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	hosts := c.Egress.HostAddrs()
	if hosts["git.internal.test"].String() != "10.213.0.2" || hosts["v6.test"].String() != "10.213.0.3" || len(hosts) != 2 {
		t.Errorf("hosts: %v", hosts)
	}
	if p := c.Egress.Prefixes(); len(p) != 2 || p[0].String() != "10.213.0.0/24" || p[1].String() != "fd00::/8" {
		t.Errorf("permit_cidrs: %v", p)
	}
	if c.Egress.MaxConnectionsPerSession != DefaultEgressConnections {
		t.Errorf("max_connections_per_session: %d", c.Egress.MaxConnectionsPerSession)
	}
	bad := map[string]string{
		"egress:\n  hostz: {}\n":                         "roostd.yaml:2: egress.hostz: unknown key (expected one of: hosts, max_bytes_per_sec_per_session, max_connections_per_session, permit_cidrs)",
		"egress:\n  hosts: {a.test: nowhere}\n":          `egress.hosts.a.test: "nowhere" is not an IP address`,
		"egress:\n  hosts: {\"*.a.test\": 10.0.0.1}\n":   `egress.hosts: "*.a.test" is not a host name`,
		"egress:\n  hosts: {\"a.test:80\": 10.0.0.1}\n":  `egress.hosts: "a.test:80" is not a host name`,
		"egress:\n  hosts: {1.2.3.4: 10.0.0.1}\n":        `egress.hosts: "1.2.3.4" is not a host name`,
		"egress:\n  hosts: {\"a b\": 10.0.0.1}\n":        `egress.hosts: "a b" is not a host name`,
		"egress:\n  permit_cidrs: [10.0.0.1]\n":          `egress.permit_cidrs[0]: "10.0.0.1" is not a CIDR prefix`,
		"egress:\n  max_connections_per_session: -1\n":   "egress.max_connections_per_session: -1",
		"egress:\n  max_bytes_per_sec_per_session: -1\n": "egress.max_bytes_per_sec_per_session: -1: must be 0",
		"egress:\n  max_connections_per_session: many\n": `roostd.yaml:2: egress.max_connections_per_session: expected an integer, got "many"`,
	}
	for src, want := range bad {
		if _, err := Parse([]byte(src), "roostd.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want %q)", src, err, want)
		}
	}
}

// Hooks: names, events, modules that exist, bounds and defaults; every error names its key.
func TestHooks(t *testing.T) {
	dir := t.TempDir()
	mod := filepath.Join(dir, "policy.wasm")
	if err := os.WriteFile(mod, []byte("\x00asm\x01\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := "hooks:\n" +
		"  - name: policy\n    on: stage\n    module: " + mod + "\n" +
		"  - {name: audit-1, on: session_end, module: " + mod + ", deadline_seconds: 600, memory_bytes: 4294967296, on_overflow: block}\n" +
		"  - {name: audit-2, on: session_end, module: " + mod + "}\n"
	c, err := Parse([]byte(good), "roostd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []Hook{
		{Name: "policy", On: HookStage, Module: mod, DeadlineSeconds: 30, MemoryBytes: 64 << 20},
		{Name: "audit-1", On: HookSessionEnd, Module: mod, DeadlineSeconds: 600, MemoryBytes: 4 << 30, OnOverflow: HookOverflowBlock},
		{Name: "audit-2", On: HookSessionEnd, Module: mod, DeadlineSeconds: 30, MemoryBytes: 64 << 20, OnOverflow: HookOverflowDrop},
	}
	if len(c.Hooks) != len(want) {
		t.Fatalf("%+v", c.Hooks)
	}
	for i := range want {
		if c.Hooks[i] != want[i] {
			t.Errorf("hooks[%d]: %+v, want %+v", i, c.Hooks[i], want[i])
		}
	}
	if d := c.Hooks[0].Deadline(); d.String() != "30s" {
		t.Errorf("deadline: %v", d)
	}

	hook := func(fields string) string {
		return "hooks:\n  - {name: ok, on: stage, module: " + mod + "}\n  - {" + fields + "}\n"
	}
	end := "name: h, on: session_end, module: " + mod
	for src, want := range map[string]string{
		hook("name: Policy, on: stage, module: " + mod):               `roostd.yaml: hooks[1].name: "Policy" is not a hook name ([a-z0-9][a-z0-9-]*)`,
		hook("name: -x, on: stage, module: " + mod):                   `hooks[1].name: "-x" is not a hook name`,
		hook("on: stage, module: " + mod):                             `hooks[1].name: "" is not a hook name`,
		hook("name: ok, on: stage, module: " + mod):                   `hooks[1].name: "ok" is declared twice`,
		hook("name: h, on: stagee, module: " + mod):                   `roostd.yaml: hooks[1].on: "stagee": expected stage or session_end`,
		hook("name: h, module: " + mod):                               `hooks[1].on: "": expected stage or session_end`,
		hook("name: h, on: stage, module: policy.wasm"):               `hooks[1].module: "policy.wasm": expected an absolute path`,
		hook("name: h, on: stage"):                                    `hooks[1].module: "": expected an absolute path`,
		hook("name: h, on: stage, module: " + mod + ".missing"):       `hooks[1].module: "` + mod + `.missing": no such file or directory`,
		hook("name: h, on: stage, module: " + dir):                    `hooks[1].module: ` + dir + ` is not a regular file`,
		hook(end + ", deadline_seconds: -1"):                          "hooks[1].deadline_seconds: -1: expected 1 to 600",
		hook(end + ", deadline_seconds: 601"):                         "hooks[1].deadline_seconds: 601: expected 1 to 600",
		hook(end + ", deadline_seconds: soon"):                        `roostd.yaml:3: hooks[1].deadline_seconds: expected an integer, got "soon"`,
		hook(end + ", memory_bytes: -1"):                              "hooks[1].memory_bytes: -1: expected 1 to 4294967296 (4 GiB)",
		hook(end + ", memory_bytes: 4294967297"):                      "hooks[1].memory_bytes: 4294967297: expected 1 to 4294967296",
		hook(end + ", on_overflow: wait"):                             `hooks[1].on_overflow: "wait": expected drop or block`,
		hook("name: h, on: stage, on_overflow: drop, module: " + mod): "hooks[1].on_overflow: a stage hook runs while its caller waits and has no queue",
		hook(end + ", deadline: 5"):                                   "roostd.yaml:3: hooks[1].deadline: unknown key (expected one of: deadline_seconds, memory_bytes, module, name, on, on_overflow)",
		"hooks: {name: h}\n":                                          "roostd.yaml:1: hooks: expected a list of mappings, got a mapping",
	} {
		if _, err := Parse([]byte(src), "roostd.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want %q)", src, err, want)
		}
	}
}

// The control API's bounds take their defaults unset, and a bad one is refused naming it.
func TestControl(t *testing.T) {
	c, err := Parse(nil, "roostd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Control{MaxStreams: DefaultControlMaxStreams, MaxStreamsPerClient: DefaultControlMaxStreamsPerClient,
		MaxRecvMessageBytes: DefaultControlMaxRecvMessageBytes, MaxSendMessageBytes: DefaultControlMaxSendMessageBytes,
		StreamSendTimeoutSeconds: DefaultControlStreamSendTimeoutSeconds}
	if c.Control != want {
		t.Fatalf("defaults: %+v, want %+v", c.Control, want)
	}
	c, err = Parse([]byte("control:\n  max_streams: 10\n  max_streams_per_client: 3\n  stream_send_timeout_seconds: 2\n"), "roostd.yaml")
	if err != nil || c.Control.MaxStreams != 10 || c.Control.MaxStreamsPerClient != 3 || c.Control.StreamSendTimeout().Seconds() != 2 || c.Control.MaxRecvMessageBytes != DefaultControlMaxRecvMessageBytes {
		t.Fatalf("%+v %v", c.Control, err)
	}
	for src, want := range map[string]string{
		"control:\n  max_streams: -1\n":                             "control.max_streams: -1",
		"control:\n  max_streams: 4\n  max_streams_per_client: 5\n": "control.max_streams_per_client: 5: must be at most control.max_streams (4)",
		"control:\n  max_recv_message_bytes: 4294967296\n":          "control.max_recv_message_bytes",
		"control:\n  stream_send_timeout_seconds: 86400\n":          "control.stream_send_timeout_seconds: 86400",
		"control:\n  max_stream: 1\n":                               "roostd.yaml:2: control.max_stream: unknown key (expected one of: max_recv_message_bytes, max_send_message_bytes, max_streams, max_streams_per_client, stream_send_timeout_seconds)",
	} {
		if _, err := Parse([]byte(src), "roostd.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want %q)", src, err, want)
		}
	}
}

// Every decode error names the file, the line, the key path and what belongs there.
func TestDecodeErrors(t *testing.T) {
	up := "inference:\n  upstreams:\n    - name: a\n      format: openai\n      url: http://x\n      api_key_file: /k\n"
	for _, c := range []struct{ src, want string }{
		// Unknown keys, at every level.
		{"listen: x\n", "roostd.yaml:1: listen: unknown key (expected one of: control, egress, env, fleet, hooks, inference, remote, sessions)"},
		{"inference:\n  upstream: []\n", "roostd.yaml:2: inference.upstream: unknown key (expected one of: max_body_bytes_in_flight, max_calls_per_session, upstreams)"},
		{up + "      key: x\n", "roostd.yaml:7: inference.upstreams[0].key: unknown key (expected one of: api_key_file, default_max_output_tokens, format, models, name, routes, url)"},
		{up + "      routes:\n        - method: GET\n          paths: x\n", "roostd.yaml:9: inference.upstreams[0].routes[0].paths: unknown key (expected one of: metered, method, path, query, tokens)"},
		{"sessions:\n  allow_root: []\n\n  descriptor_per_session: 3\n", "roostd.yaml:4: sessions.descriptor_per_session: unknown key (expected one of: allow_root, descriptors_per_session, host_paths, ids)"},
		{"sessions:\n  ids:\n    start: 65536\n", "roostd.yaml:3: sessions.ids.start: unknown key (expected one of: first, per_tree, slots, spawns)"},
		{"env:\n  pass: [LANG]\n", "roostd.yaml:2: env.pass: unknown key (expected one of: passthrough)"},
		{"egress:\n  cidrs: []\n", "roostd.yaml:2: egress.cidrs: unknown key (expected one of: hosts, max_bytes_per_sec_per_session, max_connections_per_session, permit_cidrs)"},
		{"control:\n  streams: 1\n", "roostd.yaml:2: control.streams: unknown key (expected one of: max_recv_message_bytes, max_send_message_bytes, max_streams, max_streams_per_client, stream_send_timeout_seconds)"},
		{"hooks:\n  - name: a\n  - name: b\n    event: stage\n", "roostd.yaml:4: hooks[1].event: unknown key (expected one of: deadline_seconds, memory_bytes, module, name, on, on_overflow)"},
		// Wrong types: a string for an integer, a list for a mapping, a mapping for a list.
		{"sessions:\n  descriptors_per_session: many\n", `roostd.yaml:2: sessions.descriptors_per_session: expected an integer, got "many"`},
		{"sessions:\n  ids:\n    first: -1\n", "roostd.yaml:3: sessions.ids.first: expected an integer from 0 to 4294967295, got -1"},
		{"sessions:\n  ids:\n    slots: 4294967296\n", "roostd.yaml:3: sessions.ids.slots: expected an integer from 0 to 4294967295, got 4294967296"},
		{"control:\n  max_streams: 1.5\n", "roostd.yaml:2: control.max_streams: expected an integer, got 1.5"},
		{"sessions: [allow_root]\n", "roostd.yaml:1: sessions: expected a mapping, got a list"},
		{"sessions:\n  ids: [1, 2]\n", "roostd.yaml:2: sessions.ids: expected a mapping, got a list"},
		{"egress:\n  hosts: [a, b]\n", "roostd.yaml:2: egress.hosts: expected a mapping of strings, got a list"},
		{"egress:\n  hosts:\n    a.test: [10.0.0.1]\n", "roostd.yaml:3: egress.hosts.a.test: expected a string, got a list"},
		{"hooks:\n  name: a\n", "roostd.yaml:2: hooks: expected a list of mappings, got a mapping"},
		{"env:\n  passthrough: {LANG: 1}\n", "roostd.yaml:2: env.passthrough: expected a list of strings, got a mapping"},
		{"sessions:\n  host_paths: [/opt, {a: b}]\n", "roostd.yaml:2: sessions.host_paths[1]: expected a string, got a mapping"},
		{"inference:\n  upstreams: [x]\n", `roostd.yaml:2: inference.upstreams[0]: expected a mapping, got "x"`},
		{up + "    - name: b\n      url: [http://x]\n", "roostd.yaml:8: inference.upstreams[1].url: expected a string, got a list"},
		{"hooks:\n  - name: a\n    on: {stage: true}\n", "roostd.yaml:3: hooks[0].on: expected a string, got a mapping"},
		{up + "      routes:\n        - {method: GET, path: x, metered: maybe}\n", `roostd.yaml:8: inference.upstreams[0].routes[0].metered: expected true or false, got "maybe"`},
		{"- a\n- b\n", "roostd.yaml:1: expected a mapping, got a list"},
		{"roostd\n", `roostd.yaml:1: expected a mapping, got "roostd"`},
		// A key twice, a second document, bad YAML.
		{"control:\n  max_streams: 1\n  max_streams: 2\n", "roostd.yaml:3: control.max_streams: given twice (first on line 2)"},
		{"env: {}\n---\nenv: {}\n", "roostd.yaml:2: roostd reads one YAML document; found a second one"},
		{"sessions:\n  ids:\n    first: 1\n   slots: 2\n", "roostd.yaml:4: YAML syntax: did not find expected key"},
		{"env:\n  passthrough: [LANG\n", "roostd.yaml:2: YAML syntax: did not find expected ',' or ']'"},
		{"control: {max_streams: 1}}\n", "roostd.yaml:1: YAML syntax: did not find expected key"},
		{"sessions:\n  allow_root: [a]\n  host_paths: 'x\n", "roostd.yaml:3: YAML syntax: found unexpected end of stream"},
	} {
		_, err := Parse([]byte(c.src), "roostd.yaml")
		if err == nil || err.Error() != c.want {
			t.Errorf("%q:\n got %v\nwant %s", c.src, err, c.want)
		}
	}
}

// What yaml itself accepts stays accepted: an empty file, comments alone, null blocks,
// anchors and merge keys.
func TestDecodeAccepts(t *testing.T) {
	for _, src := range []string{"", "# nothing\n", "---\n", "sessions:\nenv: ~\n"} {
		c, err := Parse([]byte(src), "roostd.yaml")
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		if !reflect.DeepEqual(c, Defaults()) {
			t.Fatalf("%q: %+v, want the defaults", src, c)
		}
	}
	c, err := Parse([]byte(`inference:
  upstreams:
    - &base {name: a, format: openai, url: "http://x", api_key_file: /k}
    - <<: *base
      name: b
env:
  passthrough: &vars [builder]
sessions:
  allow_root: *vars
`), "roostd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if u := c.Inference.Upstreams; len(u) != 2 || u[1].Name != "b" || u[1].URL != "http://x" || c.Sessions.AllowRoot[0] != "builder" {
		t.Fatalf("anchors and merges: %+v", c)
	}
	if _, err := Parse([]byte("inference:\n  upstreams:\n    - <<: {nam: a}\n"), "roostd.yaml"); err == nil ||
		err.Error() != "roostd.yaml:3: inference.upstreams[0].nam: unknown key (expected one of: api_key_file, default_max_output_tokens, format, models, name, routes, url)" {
		t.Fatalf("a merged unknown key: %v", err)
	}
}

func TestRemote(t *testing.T) {
	c, err := Parse([]byte(`remote:
  listen: 127.0.0.1:7443
  tls_cert: /etc/roost/tls/server.pem
  tls_key: /etc/roost/tls/server-key.pem
  client_ca: /etc/roost/tls/clients-ca.pem
  clients:
    - {common_name: ci-bot, role: operator}
    - {common_name: dashboard, role: reader}
`), "roostd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Remote{Listen: "127.0.0.1:7443", TLSCert: "/etc/roost/tls/server.pem", TLSKey: "/etc/roost/tls/server-key.pem", ClientCA: "/etc/roost/tls/clients-ca.pem",
		Clients: []RemoteClient{{"ci-bot", RoleOperator}, {"dashboard", RoleReader}}}
	if !reflect.DeepEqual(c.Remote, want) {
		t.Fatalf("got %+v, want %+v", c.Remote, want)
	}
	for src, want := range map[string]string{
		"remote:\n  listen: 7443\n":                                                                `roostd.yaml: remote.listen: "7443": expected HOST:PORT`,
		"remote:\n  listen: localhost:https\n":                                                     `remote.listen: "localhost:https": expected HOST:PORT`,
		"remote:\n  listen: :7443\n":                                                               `remote.listen: ":7443": name the address to listen on`,
		"remote:\n  tls_key: tls/server-key.pem\n":                                                 `roostd.yaml: remote.tls_key: "tls/server-key.pem": expected an absolute path`,
		"remote:\n  clients: [{common_name: a, role: admin}]\n":                                    `roostd.yaml: remote.clients[0].role: "admin": expected operator, reader or node`,
		"remote:\n  clients: [{common_name: a, role: reader}, {common_name: a, role: operator}]\n": `roostd.yaml: remote.clients[1].common_name: "a" is listed twice`,
		"remote:\n  clients: [{role: reader}]\n":                                                   `roostd.yaml: remote.clients[0].common_name: required`,
		"remote:\n  clients: [{common_name: a, roles: reader}]\n":                                  `roostd.yaml:2: remote.clients[0].roles: unknown key (expected one of: common_name, role)`,
		"remote:\n  listn: 127.0.0.1:7443\n":                                                       `roostd.yaml:2: remote.listn: unknown key`,
	} {
		if _, err := Parse([]byte(src), "roostd.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want %q)", src, err, want)
		}
	}
}

func TestFleet(t *testing.T) {
	c, err := Parse([]byte(`fleet:
  etcd: [https://10.0.0.1:2379, https://10.0.0.2:2379]
  node_name: node-a
  etcd_ca: /etc/roost/etcd/ca.pem
  etcd_cert: /etc/roost/etcd/client.pem
  etcd_key: /etc/roost/etcd/client-key.pem
  node_tls: {cert: /etc/roost/tls/node-a.pem, key: /etc/roost/tls/node-a-key.pem, ca: /etc/roost/tls/ca.pem}
`), "roostd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Fleet{Etcd: []string{"https://10.0.0.1:2379", "https://10.0.0.2:2379"}, NodeName: "node-a",
		EtcdCA: "/etc/roost/etcd/ca.pem", EtcdCert: "/etc/roost/etcd/client.pem", EtcdKey: "/etc/roost/etcd/client-key.pem",
		NodeTLS: NodeTLS{Cert: "/etc/roost/tls/node-a.pem", Key: "/etc/roost/tls/node-a-key.pem", CA: "/etc/roost/tls/ca.pem"}}
	if !reflect.DeepEqual(c.Fleet, want) {
		t.Fatalf("got %+v, want %+v", c.Fleet, want)
	}
	for in, msg := range map[string]string{
		"fleet:\n  etcd: [10.0.0.1:2379]\n":                                      `roostd.yaml: fleet.etcd[0]: "10.0.0.1:2379": expected a client URL`,
		"fleet:\n  etcd: [http://a:1]\n  etcd_ca: ca.pem\n":                      `roostd.yaml: fleet.etcd_ca: "ca.pem": expected an absolute path`,
		"fleet:\n  etcd: [http://a:1]\n  etcd_cert: /c.pem\n":                    `fleet.etcd_cert and fleet.etcd_key: give both or neither`,
		"fleet:\n  node_name: a\n":                                               `roostd.yaml: fleet.node_name: "a": set fleet.etcd too`,
		"fleet:\n  etcd: [http://a:1]\n  node_tls: {cert: /n.pem}\n":             `fleet.node_tls.cert and fleet.node_tls.key: give both or neither`,
		"fleet:\n  etcd: [http://a:1]\n  node_tls: {cert: n.pem, key: /k.pem}\n": `roostd.yaml: fleet.node_tls.cert: "n.pem": expected an absolute path`,
		"fleet:\n  etcd: [http://a:1]\n  node_tls: {ca: /ca.pem}\n":              `fleet.node_tls.ca: set fleet.node_tls.cert and key too`,
		"fleet:\n  node_tls: {cert: /n.pem, key: /k.pem}\n":                      `roostd.yaml: fleet.node_tls: set fleet.etcd too`,
		"fleet:\n  etcd: [http://a:1]\n  node_tls: {crt: /n.pem}\n":              `fleet.node_tls.crt: unknown key`,
		"fleet:\n  etcd: [http://a:1]\n  node: a\n":                              `roostd.yaml:3: fleet.node: unknown key`,
	} {
		_, err := Parse([]byte(in), "roostd.yaml")
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: got %v, want %q", in, err, msg)
		}
	}
}
