package deploytest

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// The Nomad job, as the subset of Nomad's job specification
// (developer.hashicorp.com/nomad/docs/job-specification) that deploy/nomad uses. gohcl
// refuses any argument or block not declared here, so a misspelt key fails, and a key
// Nomad has but this subset lacks must be added deliberately, from Nomad's reference.
// (`nomad job validate` needs a Nomad agent to ask, so it is not used.)
type nomadFile struct {
	Jobs []nomadJob `hcl:"job,block"`
}

type nomadJob struct {
	Name        string            `hcl:"name,label"`
	Type        string            `hcl:"type"`
	Datacenters []string          `hcl:"datacenters,optional"`
	Constraints []nomadConstraint `hcl:"constraint,block"`
	Groups      []nomadGroup      `hcl:"group,block"`
}

type nomadConstraint struct {
	Attribute string `hcl:"attribute,optional"`
	Operator  string `hcl:"operator,optional"`
	Value     string `hcl:"value,optional"`
}

type nomadGroup struct {
	Name     string         `hcl:"name,label"`
	Restart  *nomadRestart  `hcl:"restart,block"`
	Network  *nomadNetwork  `hcl:"network,block"`
	Services []nomadService `hcl:"service,block"`
	Tasks    []nomadTask    `hcl:"task,block"`
}

type nomadRestart struct {
	Attempts int    `hcl:"attempts"`
	Interval string `hcl:"interval"`
	Delay    string `hcl:"delay"`
	Mode     string `hcl:"mode"`
}

type nomadNetwork struct {
	Ports []nomadPort `hcl:"port,block"`
}

type nomadPort struct {
	Label  string `hcl:"label,label"`
	Static int    `hcl:"static,optional"`
}

type nomadService struct {
	Name     string       `hcl:"name"`
	Provider string       `hcl:"provider,optional"`
	Port     string       `hcl:"port"`
	Tags     []string     `hcl:"tags,optional"`
	Checks   []nomadCheck `hcl:"check,block"`
}

type nomadCheck struct {
	Type     string `hcl:"type"`
	Path     string `hcl:"path,optional"`
	Interval string `hcl:"interval"`
	Timeout  string `hcl:"timeout"`
}

type nomadTask struct {
	Name        string          `hcl:"name,label"`
	Driver      string          `hcl:"driver"`
	Config      nomadRawExec    `hcl:"config,block"`
	KillSignal  string          `hcl:"kill_signal,optional"`
	KillTimeout string          `hcl:"kill_timeout,optional"`
	Resources   *nomadResources `hcl:"resources,block"`
}

// nomadRawExec is the raw_exec driver's task config.
type nomadRawExec struct {
	Command string   `hcl:"command"`
	Args    []string `hcl:"args,optional"`
}

type nomadResources struct {
	CPU    int `hcl:"cpu,optional"`
	Memory int `hcl:"memory,optional"`
}

// nomadRuntimeRoots are the variables Nomad interpolates when it places a task
// (${node.unique.name}, ${NOMAD_ADDR_metrics}, ...): each evaluates here to its own
// ${...} text, so the decoded job holds what Nomad would fill in. Any other variable fails.
func nomadRuntime(body *hclsyntax.Body) (*hcl.EvalContext, error) {
	tree := map[string]any{}
	var bad error
	hclsyntax.VisitAll(body, func(n hclsyntax.Node) hcl.Diagnostics {
		e, ok := n.(*hclsyntax.ScopeTraversalExpr)
		if !ok || bad != nil {
			return nil
		}
		root := e.Traversal.RootName()
		if !slices.Contains([]string{"node", "attr", "meta"}, root) && !strings.HasPrefix(root, "NOMAD_") {
			bad = fmt.Errorf("%s: ${%s...}: not one of Nomad's runtime variables (node, attr, meta, NOMAD_*)", e.SrcRange, root)
			return nil
		}
		names := []string{root}
		for _, step := range e.Traversal[1:] {
			a, ok := step.(hcl.TraverseAttr)
			if !ok {
				bad = fmt.Errorf("%s: only attribute steps are supported here", e.SrcRange)
				return nil
			}
			names = append(names, a.Name)
		}
		at := tree
		for i, name := range names {
			if i == len(names)-1 {
				if _, isMap := at[name].(map[string]any); isMap {
					bad = fmt.Errorf("%s: ${%s} is both a value and an object", e.SrcRange, strings.Join(names, "."))
				}
				at[name] = "${" + strings.Join(names, ".") + "}"
				break
			}
			next, ok := at[name].(map[string]any)
			if !ok {
				if _, isLeaf := at[name]; isLeaf {
					bad = fmt.Errorf("%s: ${%s} is both a value and an object", e.SrcRange, strings.Join(names[:i+1], "."))
					return nil
				}
				next = map[string]any{}
				at[name] = next
			}
			at = next
		}
		return nil
	})
	if bad != nil {
		return nil, bad
	}
	var toCty func(v any) cty.Value
	toCty = func(v any) cty.Value {
		m, ok := v.(map[string]any)
		if !ok {
			return cty.StringVal(v.(string))
		}
		attrs := map[string]cty.Value{}
		for k, x := range m {
			attrs[k] = toCty(x)
		}
		return cty.ObjectVal(attrs)
	}
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{}}
	for k, v := range tree {
		ctx.Variables[k] = toCty(v)
	}
	return ctx, nil
}

func decodeNomad(t *testing.T, file string) nomadJob {
	t.Helper()
	p := hclparse.NewParser()
	f, diags := p.ParseHCLFile(file)
	if diags.HasErrors() {
		t.Fatalf("%s: %v", file, diags)
	}
	ctx, err := nomadRuntime(f.Body.(*hclsyntax.Body))
	if err != nil {
		t.Fatal(err)
	}
	var nf nomadFile
	if diags := gohcl.DecodeBody(f.Body, ctx, &nf); diags.HasErrors() {
		t.Fatalf("%s: %v", file, diags)
	}
	if len(nf.Jobs) != 1 {
		t.Fatalf("%s: %d jobs, want 1", file, len(nf.Jobs))
	}
	return nf.Jobs[0]
}

func TestNomad(t *testing.T) {
	bin := build(t)
	file := filepath.Join(repo, "deploy/nomad/roostd.nomad.hcl")
	job := decodeNomad(t, file)
	if job.Type != "system" {
		t.Errorf("%s: job type %q, want system (one roostd on every client of the pool)", file, job.Type)
	}
	if !slices.ContainsFunc(job.Constraints, func(c nomadConstraint) bool {
		return (c.Attribute == "${node.class}" || strings.HasPrefix(c.Attribute, "${meta.")) && c.Value != ""
	}) {
		t.Errorf("%s: no constraint on the node class or a node meta key: roostd would run on every client", file)
	}
	if len(job.Groups) != 1 || len(job.Groups[0].Tasks) != 1 {
		t.Fatalf("%s: want one group of one task", file)
	}
	g := job.Groups[0]
	task := g.Tasks[0]
	if g.Restart == nil || g.Restart.Attempts < 1 || g.Restart.Mode != "delay" {
		t.Errorf("%s: group %s: restart %+v: want attempts ≥ 1 and mode delay (a system job's allocation is restarted in place, never failed)", file, g.Name, g.Restart)
	}
	if task.Driver != "raw_exec" || filepath.Base(task.Config.Command) != "roostd" {
		t.Errorf("%s: task %s: driver %q command %q, want raw_exec running roostd", file, task.Name, task.Driver, task.Config.Command)
	}
	if task.KillSignal != "SIGTERM" {
		t.Errorf("%s: kill_signal %q, want SIGTERM (roostd's clean stop)", file, task.KillSignal)
	}
	ports := map[string]int{}
	if g.Network != nil {
		for _, p := range g.Network.Ports {
			ports[p.Label] = p.Static
		}
	}
	// Nomad's runtime values, with samples, for roostd to parse.
	sample := map[string]string{"${node.unique.name}": "client-a", "${node.class}": "roost-capsules"}
	var args []string
	for _, a := range task.Config.Args {
		a = regexp.MustCompile(`\$\{NOMAD_ADDR_([a-z0-9_]+)\}`).ReplaceAllStringFunc(a, func(m string) string {
			label := m[len("${NOMAD_ADDR_") : len(m)-1]
			p, ok := ports[label]
			if !ok {
				t.Errorf("%s: %s: no network port %q", file, m, label)
			}
			return fmt.Sprintf("192.0.2.20:%d", p)
		})
		for k, v := range sample {
			a = strings.ReplaceAll(a, k, v)
		}
		if strings.Contains(a, "${") {
			t.Errorf("%s: arg %q: a runtime variable with no sample here", file, a)
		}
		args = append(args, a)
	}
	if err := bin.checkRoostdArgs(file, args); err != nil {
		t.Error(err)
	}
	if v, _ := flagValue(task.Config.Args, "node-name"); v != "${node.unique.name}" {
		t.Errorf("%s: --node-name is %q, want ${node.unique.name} (unique and the same across restarts)", file, v)
	}
	if v, _ := flagValue(task.Config.Args, "cgroup-parent"); v == "" {
		t.Errorf("%s: no --cgroup-parent: sessions' cgroups must go outside the task's, which Nomad kills", file)
	}
	if v, _ := flagValue(task.Config.Args, "fleet-etcd"); !sameSet(strings.Split(v, ","), fleetClientURLs(t)) {
		t.Errorf("%s: --fleet-etcd %q is not deploy/systemd/etcd's members' %v", file, v, fleetClientURLs(t))
	}
	if v, _ := flagValue(task.Config.Args, "metrics-addr"); v != "${NOMAD_ADDR_metrics}" {
		t.Errorf("%s: --metrics-addr %q, want ${NOMAD_ADDR_metrics}, the port the service names", file, v)
	}
	if !slices.ContainsFunc(g.Services, func(s nomadService) bool {
		_, ok := ports[s.Port]
		return s.Port == "metrics" && ok && slices.ContainsFunc(s.Checks, func(c nomadCheck) bool { return c.Type == "http" && c.Path == "/metrics" })
	}) {
		t.Errorf("%s: no service on the metrics port with an http check of /metrics", file)
	}
}
