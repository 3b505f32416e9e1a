package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"go.yaml.in/yaml/v3"
)

const head = "name: hello\nversion: 0.1.0\nrun:\n  command: [/bin/true]\n"

func mustParse(t *testing.T, src string) *Manifest {
	t.Helper()
	m, err := Parse([]byte(src), "capsule.yaml")
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror: %v", src, err)
	}
	return m
}

func parseErr(t *testing.T, src string) *Error {
	t.Helper()
	_, err := Parse([]byte(src), "capsule.yaml")
	if err == nil {
		t.Fatalf("Parse accepted:\n%s", src)
	}
	var me *Error
	if !errors.As(err, &me) {
		t.Fatalf("error %T is not *Error: %v", err, err)
	}
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("error does not classify as invalid argument: %v", err)
	}
	return me
}

func TestParseFull(t *testing.T) {
	src := `name: hello
version: 1.2.3-rc.1+build.5
run:
  command: ["/bin/sh", "-c", "echo hi"]
  args: [x]
env:
  GREETING: hi
  PORT: 8080
inference:
  upstream: openai
  model: gpt-4.1
  max_session_tokens: 100000
  on_exhausted: wait
capabilities:
  containment: sealed
  network:
    allow: ["api.example.com", "https://files.example.com", "10.0.0.1:443", "[::1]:8080"]
    unix_sockets: true
  filesystem:
    scope: src/
    workdir_exec: true
    read_only: [tests, "  ", " docs/ "]
  shell:
    allow: [python3, sh, /usr/bin/ls]
  spawn:
    allow: [worker, helper]
    workdir_snapshot: [worker]
    max_depth: 4
    max_children: 16
  env:
    allow: [LANG]
  limits:
    deadline_seconds: 60
    memory_bytes: 1024
  resources:
    cgroup_memory_bytes: 1
    cgroup_pids_max: 2
    cgroup_cpu_percent: 3
    max_open_files: 4
    max_file_size_bytes: 5
    cpu_seconds: 6
    max_processes: 7
    memory_bytes: 8
    workdir_max_bytes: 9
    egress_bytes_per_sec: 10
`
	m := mustParse(t, src)
	if m.Name != "hello" || m.Version != "1.2.3-rc.1+build.5" || m.Ref() != "hello@1.2.3-rc.1+build.5" {
		t.Fatalf("identity: %+v", m)
	}
	if !reflect.DeepEqual(m.Run.Command, []string{"/bin/sh", "-c", "echo hi"}) || !reflect.DeepEqual(m.Run.Args, []string{"x"}) {
		t.Fatalf("run: %+v", m.Run)
	}
	if m.Env["PORT"] != "8080" || m.Env["GREETING"] != "hi" {
		t.Fatalf("env: %v", m.Env)
	}
	p := Lower(m)
	if p.Containment != Sealed || !p.ContainmentDeclared {
		t.Fatalf("containment: %v", p.Containment)
	}
	wantNet := []NetRule{{Host: "api.example.com"}, {Scheme: "https", Host: "files.example.com"}, {Host: "10.0.0.1", Port: 443}, {Host: "::1", Port: 8080}}
	if !reflect.DeepEqual(p.Network.Allow, wantNet) || !p.Network.UnixSockets {
		t.Fatalf("network: %+v", p.Network)
	}
	if p.Filesystem.Scope != "src" || !p.Filesystem.WorkdirExec || !reflect.DeepEqual(p.Filesystem.ReadOnly, []string{"tests", "docs"}) {
		t.Fatalf("filesystem: %+v", p.Filesystem)
	}
	if !reflect.DeepEqual(p.Shell.Allow, []string{"python3", "sh", "/usr/bin/ls"}) {
		t.Fatalf("shell: %+v", p.Shell)
	}
	if p.Spawn.MaxDepth.Value != 4 || p.Spawn.MaxChildren.Value != 16 || !reflect.DeepEqual(p.Spawn.WorkdirSnapshot, []string{"worker"}) {
		t.Fatalf("spawn: %+v", p.Spawn)
	}
	r := p.Resources
	got := []int64{r.CgroupMemoryBytes.Value, r.CgroupPidsMax.Value, r.CgroupCPUPercent.Value, r.MaxOpenFiles.Value, r.MaxFileSizeBytes.Value, r.CPUSeconds.Value, r.MaxProcesses.Value, r.MemoryBytes.Value, r.WorkdirMaxBytes.Value, r.EgressBytesPerSec.Value}
	if !reflect.DeepEqual(got, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
		t.Fatalf("resources: %v", got)
	}
	if p.Limits.DeadlineSeconds.Value != 60 || p.Limits.MemoryBytes.Value != 1024 {
		t.Fatalf("limits: %+v", p.Limits)
	}
	if p.Inference.Upstream != "openai" || *p.Inference.MaxSessionTokens != 100000 || p.Inference.OnExhausted != "wait" {
		t.Fatalf("inference: %+v", p.Inference)
	}
}

// Every shape of "not declared" lowers to the same deny.
func TestDenyShapes(t *testing.T) {
	shapes := map[string]string{
		"no capabilities":         "",
		"null capabilities":       "capabilities:\n",
		"empty capabilities":      "capabilities: {}\n",
		"null sub-blocks":         "capabilities:\n  network:\n  filesystem:\n  shell:\n  spawn:\n  env:\n",
		"empty sub-blocks":        "capabilities:\n  network: {}\n  filesystem: {}\n  shell: {}\n  spawn: {}\n  env: {}\n",
		"null keys":               "capabilities:\n  network:\n    allow:\n    unix_sockets:\n  filesystem:\n    workdir_exec:\n    read_only:\n  shell:\n    allow:\n  spawn:\n    allow:\n  env:\n    allow:\n",
		"explicit false or empty": "capabilities:\n  network:\n    allow: []\n    unix_sockets: false\n  filesystem:\n    workdir_exec: false\n    read_only: []\n  shell:\n    allow: []\n  spawn:\n    allow: []\n    workdir_snapshot: []\n  env:\n    allow: []\n",
		"blank read_only entries": "capabilities:\n  filesystem:\n    read_only: [\"\", \"   \"]\n",
	}
	for name, caps := range shapes {
		t.Run(name, func(t *testing.T) {
			p := Lower(mustParse(t, head+caps))
			if len(p.Network.Allow) != 0 || p.Network.UnixSockets {
				t.Errorf("network not denied: %+v", p.Network)
			}
			if p.Filesystem.WorkdirExec || len(p.Filesystem.ReadOnly) != 0 || p.Filesystem.Scope != "" {
				t.Errorf("filesystem not denied: %+v", p.Filesystem)
			}
			if len(p.Shell.Allow) != 0 {
				t.Errorf("shell not denied: %+v", p.Shell)
			}
			if len(p.Spawn.Allow) != 0 || len(p.Spawn.WorkdirSnapshot) != 0 {
				t.Errorf("spawn not denied: %+v", p.Spawn)
			}
			if len(p.Env.Allow) != 0 {
				t.Errorf("env not denied: %+v", p.Env)
			}
			if p.Containment != DefaultClass || p.ContainmentDeclared {
				t.Errorf("containment: %v declared=%v", p.Containment, p.ContainmentDeclared)
			}
		})
	}
}

// max_processes follows cgroup_pids_max, declared or not, unless declared itself.
func TestMaxProcessesFollowsPidsMax(t *testing.T) {
	for _, c := range []struct {
		resources string
		want      int64
		declared  bool
	}{
		{"", DefaultCgroupPidsMax, false},
		{"{cgroup_pids_max: 1024}", 1024, false},
		{"{cgroup_pids_max: 1024, max_processes: 300}", 300, true},
		{"{max_processes: 300}", 300, true},
	} {
		src := head
		if c.resources != "" {
			src += "capabilities:\n  resources: " + c.resources + "\n"
		}
		got := Lower(mustParse(t, src)).Resources.MaxProcesses
		if got.Value != c.want || (got.Declared != nil) != c.declared {
			t.Errorf("resources %s: max_processes %+v, want %d (declared %v)", c.resources, got, c.want, c.declared)
		}
	}
}

func TestDefaultsFilledAndDeclaredKept(t *testing.T) {
	p := Lower(mustParse(t, head))
	defaults := map[string]struct {
		got  Limit
		want int64
	}{
		"limits.deadline_seconds":        {p.Limits.DeadlineSeconds, DefaultDeadlineSeconds},
		"limits.memory_bytes":            {p.Limits.MemoryBytes, DefaultWasmMemoryBytes},
		"resources.cgroup_memory_bytes":  {p.Resources.CgroupMemoryBytes, DefaultCgroupMemoryBytes},
		"resources.cgroup_pids_max":      {p.Resources.CgroupPidsMax, DefaultCgroupPidsMax},
		"resources.cgroup_cpu_percent":   {p.Resources.CgroupCPUPercent, DefaultCgroupCPUPercent},
		"resources.max_open_files":       {p.Resources.MaxOpenFiles, DefaultMaxOpenFiles},
		"resources.max_file_size_bytes":  {p.Resources.MaxFileSizeBytes, DefaultMaxFileSizeBytes},
		"resources.cpu_seconds":          {p.Resources.CPUSeconds, DefaultCPUSeconds},
		"resources.max_processes":        {p.Resources.MaxProcesses, DefaultCgroupPidsMax},
		"resources.memory_bytes":         {p.Resources.MemoryBytes, DefaultMemoryBytes},
		"resources.workdir_max_bytes":    {p.Resources.WorkdirMaxBytes, DefaultWorkdirMaxBytes},
		"resources.egress_bytes_per_sec": {p.Resources.EgressBytesPerSec, DefaultEgressBytesPerSec},
		"spawn.max_depth":                {p.Spawn.MaxDepth, DefaultSpawnMaxDepth},
		"spawn.max_children":             {p.Spawn.MaxChildren, DefaultSpawnMaxChildren},
	}
	for key, c := range defaults {
		if c.got.Value != c.want || c.got.Declared != nil {
			t.Errorf("%s = %+v, want default %d, undeclared", key, c.got, c.want)
		}
	}
	if p.Inference.MaxSessionTokens != nil || p.Inference.OnExhausted != OnExhaustedFail {
		t.Errorf("inference defaults: %+v", p.Inference)
	}

	// An explicit value equal to the default stays distinguishable from the default.
	q := Lower(mustParse(t, head+"capabilities:\n  resources:\n    max_open_files: 1024\n  limits:\n    deadline_seconds: 3600\n"))
	if q.Resources.MaxOpenFiles.Declared == nil || *q.Resources.MaxOpenFiles.Declared != 1024 || q.Resources.MaxOpenFiles.Value != 1024 {
		t.Errorf("declared max_open_files lost: %+v", q.Resources.MaxOpenFiles)
	}
	if q.Resources.CPUSeconds.Declared != nil {
		t.Errorf("undeclared cpu_seconds marked declared")
	}
	q.LowerDeadline(10)
	if q.Limits.DeadlineSeconds.Value != 10 || *q.Limits.DeadlineSeconds.Declared != 3600 {
		t.Errorf("LowerDeadline: %+v", q.Limits.DeadlineSeconds)
	}
	q.LowerDeadline(99999)
	if q.Limits.DeadlineSeconds.Value != 10 {
		t.Errorf("LowerDeadline raised the deadline: %+v", q.Limits.DeadlineSeconds)
	}
	q.LowerCgroupMemory(64 << 20)
	if q.Resources.CgroupMemoryBytes.Value != 64<<20 || q.Resources.CgroupMemoryBytes.Declared != nil {
		t.Errorf("LowerCgroupMemory: %+v", q.Resources.CgroupMemoryBytes)
	}
	q.LowerCgroupMemory(DefaultCgroupMemoryBytes)
	if q.Resources.CgroupMemoryBytes.Value != 64<<20 {
		t.Errorf("LowerCgroupMemory raised the memory: %+v", q.Resources.CgroupMemoryBytes)
	}
}

func TestErrors(t *testing.T) {
	cases := []struct {
		name, src string
		// want is one line of the error message: "capsule.yaml:LINE:COL: path: msg" prefix.
		want string
	}{
		{"misspelt capability", head + "capabilities:\n  netwrok: {}\n", `capsule.yaml:6:3: capabilities.netwrok: unknown key (did you mean "network"?)`},
		{"unknown top key", head + "config: {}\n", `capsule.yaml:5:1: config: unknown key`},
		{"duplicate key", head + "name: again\n", `capsule.yaml:5:1: name: key appears twice`},
		{"missing name", "version: 0.1.0\nrun:\n  command: [x]\n", `name: required`},
		{"missing run", "name: a\nversion: 0.1.0\n", `run: required`},
		{"bad name", "name: Hello\nversion: 0.1.0\nrun: {command: [x]}\n", `capsule.yaml:1:7: name: "Hello" is not a capsule name`},
		{"bad version", "name: a\nversion: \"1.0\"\nrun: {command: [x]}\n", `version: "1.0" is not a semantic version`},
		{"float version", "name: a\nversion: 1.0\nrun: {command: [x]}\n", `version: expected a string, got a number (quote it: "1.0")`},
		{"both command and wasm", "name: a\nversion: 0.1.0\nrun: {command: [x], wasm: a.wasm}\n", `run: needs exactly one of command or wasm; it has both`},
		{"neither command nor wasm", "name: a\nversion: 0.1.0\nrun: {args: [x]}\n", `run: needs exactly one of command or wasm; it has neither`},
		{"empty command", "name: a\nversion: 0.1.0\nrun: {command: []}\n", `run.command: must name a program`},
		{"wasm escapes", "name: a\nversion: 0.1.0\nrun: {wasm: ../x.wasm}\n", `run.wasm: "../x.wasm" climbs out`},
		{"zero limit", head + "capabilities:\n  resources:\n    max_open_files: 0\n", `capsule.yaml:7:21: capabilities.resources.max_open_files: must be greater than 0`},
		{"zero share", head + "capabilities:\n  resources:\n    egress_bytes_per_sec: 0\n", `capabilities.resources.egress_bytes_per_sec: must be greater than 0`},
		{"negative limit", head + "capabilities:\n  limits:\n    deadline_seconds: -5\n", `capabilities.limits.deadline_seconds: must be greater than 0`},
		{"string limit", head + "capabilities:\n  limits:\n    deadline_seconds: \"60\"\n", `deadline_seconds: expected a whole number, got a string`},
		{"float limit", head + "capabilities:\n  resources:\n    cpu_seconds: 1.5\n", `cpu_seconds: expected a whole number, got a number`},
		{"huge limit", head + "capabilities:\n  resources:\n    cpu_seconds: 99999999999999999999\n", `cpu_seconds: expected a whole number that fits in 64 bits`},
		{"huge deadline", head + "capabilities:\n  limits:\n    deadline_seconds: 9223372036854775807\n", `deadline_seconds: must be at most`},
		{"absolute scope", head + "capabilities:\n  filesystem:\n    scope: /etc\n", `capabilities.filesystem.scope: "/etc" is absolute`},
		{"dotdot scope", head + "capabilities:\n  filesystem:\n    scope: src/../../x\n", `capabilities.filesystem.scope: "src/../../x" climbs out`},
		{"empty scope", head + "capabilities:\n  filesystem:\n    scope: \"\"\n", `capabilities.filesystem.scope: is empty`},
		{"dotdot read_only", head + "capabilities:\n  filesystem:\n    read_only: [ok, ../x]\n", `capabilities.filesystem.read_only[1]: "../x" climbs out`},
		{"bad net scheme", head + "capabilities:\n  network:\n    allow: [\"ftp://x.com\"]\n", `capabilities.network.allow[0]: "ftp://x.com" is not a network.allow entry`},
		{"net path", head + "capabilities:\n  network:\n    allow: [\"https://x.com/path\"]\n", `only a host and a port may follow the scheme`},
		{"net bad port", head + "capabilities:\n  network:\n    allow: [\"x.com:99999\"]\n", `port "99999" is not a number from 1 to 65535`},
		{"net empty port", head + "capabilities:\n  network:\n    allow: [\"x.com:\"]\n", `empty port`},
		{"net bad host", head + "capabilities:\n  network:\n    allow: [\"-x.com\"]\n", `"-x.com" is not a host name`},
		{"net not a list", head + "capabilities:\n  network:\n    allow: x.com\n", `capabilities.network.allow: expected a list, got a string`},
		{"unix_sockets string", head + "capabilities:\n  network:\n    unix_sockets: \"yes\"\n", `unix_sockets: expected true or false, got a string`},
		{"bad containment", head + "capabilities:\n  containment: jailed\n", `capabilities.containment: "jailed" is not a containment class`},
		{"shell relative path", head + "capabilities:\n  shell:\n    allow: [bin/tool]\n", `capabilities.shell.allow[0]: "bin/tool"`},
		{"spawn bad name", head + "capabilities:\n  spawn:\n    allow: [Worker]\n", `capabilities.spawn.allow[0]: "Worker" is not a capsule name`},
		{"snapshot not allowed", head + "capabilities:\n  spawn:\n    allow: [a]\n    workdir_snapshot: [b]\n", `capabilities.spawn.workdir_snapshot[0]: "b" is not in capabilities.spawn.allow`},
		{"credential env.allow", head + "capabilities:\n  env:\n    allow: [GITHUB_TOKEN]\n", `capabilities.env.allow[0]: "GITHUB_TOKEN" looks like a credential`},
		{"roost env", head + "env:\n  ROOST_SESSION_ID: x\n", `env.ROOST_SESSION_ID: "ROOST_SESSION_ID": ROOST_* variables are set by roost`},
		{"env structure", head + "env:\n  A: [1]\n", `env.A: expected a value, got a list`},
		{"bad env name", head + "env:\n  1A: x\n", `"1A" is not a variable name`},
		{"filesystem.system", head + "capabilities:\n  filesystem:\n    system: some\n", `capabilities.filesystem.system: "some": expected "allowlist"`},
		{"on_exhausted", head + "inference:\n  on_exhausted: retry\n", `inference.on_exhausted: "retry": expected "fail" or "wait"`},
		{"inference zero", head + "inference:\n  max_session_tokens: 0\n", `inference.max_session_tokens: must be greater than 0`},
		{"alias", "name: &n hello\nversion: 0.1.0\nrun: {command: [x]}\ncapabilities:\n  shell:\n    allow: [*n]\n", `aliases are not supported`},
		{"not a mapping", "- a\n- b\n", `expected a mapping, got a list`},
		{"empty", "", `the manifest is empty`},
		{"syntax", "name: [unclosed\n", `capsule.yaml:`},
		{"two documents", head + "---\nname: b\n", `a manifest is one YAML document`},
		{"sub-block wrong type", head + "capabilities:\n  network: [a]\n", `capabilities.network: expected a mapping, got a list`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := parseErr(t, c.src)
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error:\n%v\nwant it to contain:\n%s", err, c.want)
			}
		})
	}
}

func TestErrorsListEveryProblem(t *testing.T) {
	err := parseErr(t, "name: A\nversion: x\nrun: {command: [x]}\ncapabilities:\n  bogus: 1\n  resources:\n    cpu_seconds: 0\n")
	if len(err.Fields) != 4 {
		t.Fatalf("want 4 problems, got %d:\n%v", len(err.Fields), err)
	}
	for _, f := range err.Fields {
		if f.Line == 0 {
			t.Errorf("problem without a line: %v", f)
		}
	}
}

func TestParseClass(t *testing.T) {
	for _, c := range Classes {
		got, err := ParseClass(c.String())
		if err != nil || got != c {
			t.Fatalf("round trip of %v: %v %v", c, got, err)
		}
	}
	if !(ClassNone < Unconfined && Unconfined < Advisory && Advisory < Scoped && Scoped < Sealed) {
		t.Fatal("class order")
	}
}

func TestNetRule(t *testing.T) {
	good := map[string]NetRule{
		"Example.COM":           {Host: "example.com"},
		"example.com:8443":      {Host: "example.com", Port: 8443},
		"http://example.com":    {Scheme: "http", Host: "example.com"},
		"https://a.b.c:1":       {Scheme: "https", Host: "a.b.c", Port: 1},
		"192.168.1.1":           {Host: "192.168.1.1"},
		"[2001:db8::1]:443":     {Host: "2001:db8::1", Port: 443},
		"https://[2001:db8::1]": {Scheme: "https", Host: "2001:db8::1"},
	}
	for in, want := range good {
		got, err := ParseNetRule(in)
		if err != nil || got != want {
			t.Errorf("ParseNetRule(%q) = %+v, %v; want %+v", in, got, err, want)
			continue
		}
		again, err := ParseNetRule(got.String())
		if err != nil || again != got {
			t.Errorf("String round trip of %q: %q -> %+v %v", in, got.String(), again, err)
		}
	}
	for _, bad := range []string{"", ":80", "x.com:0", "x.com:08", "a..b", "https://", "https://x.com:", "[::1", "[::1]x", "[1.2.3.4]", "x.com:80:80", "user@x.com", "*.com", "a.*.x.com", "*x.com", "https://x.com?q"} {
		if _, err := ParseNetRule(bad); err == nil {
			t.Errorf("ParseNetRule(%q) accepted", bad)
		}
	}
}

func TestCredentialShaped(t *testing.T) {
	for _, n := range []string{"GITHUB_TOKEN", "OPENAI_API_KEY", "AWS_REGION", "DB_PASSWORD", "my_secret", "SSH_AUTH_SOCK", "SIGNING_KEY",
		"DATABASE_DSN", "SENTRY_DSN", "MYSQL_PWD", "PGPASSWORD", "GPG_PASSPHRASE", "SLACK_WEBHOOK_URL", "COSIGN_SIGNING_MATERIAL", "PRIVATE_REGISTRY"} {
		if !CredentialShaped(n) {
			t.Errorf("%s not credential-shaped", n)
		}
	}
	for _, n := range []string{"LANG", "PATH", "HOME", "TZ", "LC_ALL", "TERM", "HTTP_PROXY", "DATABASE_URL"} {
		if CredentialShaped(n) {
			t.Errorf("%s credential-shaped", n)
		}
	}
}

func TestCredentialValue(t *testing.T) {
	for _, v := range []string{"http://user:pass@proxy:3128", "postgres://app:pw@db.internal/app", "https://token@github.com/o/r.git",
		"localhost, http://u:p@proxy:8080", "redis://:secret@cache:6379/0"} {
		if !CredentialValue(v) {
			t.Errorf("%q does not look like it carries a credential", v)
		}
	}
	for _, v := range []string{"http://proxy:3128", "C.UTF-8", "/usr/bin:/bin", "user@example.com", "https://example.com/a@b", "localhost,127.0.0.1"} {
		if CredentialValue(v) {
			t.Errorf("%q looks like a credential", v)
		}
	}
}

func TestSizeBound(t *testing.T) {
	big := head + "env:\n  A: \"" + strings.Repeat("x", MaxSize) + "\"\n"
	if err := parseErr(t, big); !strings.Contains(err.Error(), "the limit is") {
		t.Fatalf("size: %v", err)
	}
}

// referenceBlock is the manifest docs/capsule-yaml.md shows under "## Every key": its first
// yaml block.
func referenceBlock(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "capsule-yaml.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Every key\n")
	if !ok {
		t.Fatal(`docs/capsule-yaml.md has no "## Every key" section`)
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal(`docs/capsule-yaml.md's "## Every key" shows no yaml block`)
	}
	block, _, _ = strings.Cut(block, "\n```")
	return block + "\n"
}

// keyPaths lists every mapping key of a YAML document by its dotted path.
func keyPaths(t *testing.T, src string) []string {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		for _, c := range n.Content {
			if n.Kind != yaml.MappingNode {
				walk(c, prefix)
			}
		}
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			path := prefix + n.Content[i].Value
			out = append(out, path)
			walk(n.Content[i+1], path+".")
		}
	}
	walk(&doc, "")
	slices.Sort(out)
	return out
}

// The reference manifests, the one docs/capsule-yaml.md shows and testdata/full.yaml, are
// valid, declare every key and the same keys.
func TestReferenceManifest(t *testing.T) {
	data, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := referenceBlock(t)
	for name, src := range map[string]string{"testdata/full.yaml": string(data), "docs/capsule-yaml.md": doc} {
		p := Lower(mustParse(t, src))
		if p.Resources.WorkdirMaxBytes.Declared == nil || p.Spawn.MaxChildren.Declared == nil || p.Limits.MemoryBytes.Declared == nil {
			t.Errorf("%s: reference manifest leaves keys undeclared: %+v", name, p)
		}
	}
	if full, shown := keyPaths(t, string(data)), keyPaths(t, doc); !slices.Equal(full, shown) {
		t.Errorf("docs/capsule-yaml.md shows the keys\n%v\ntestdata/full.yaml declares\n%v", shown, full)
	}
}
