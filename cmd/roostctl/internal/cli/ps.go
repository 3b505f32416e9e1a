package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"sort"
	"strings"
	"text/template"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// shortIDLen is how many hex digits of a session id ps shows: the id's random end (its
// start is its creation time, shared by sessions staged close together). roostd resolves
// the same short id (store.ShortIDLen).
const shortIDLen = 12

// sessionStates are the states a state filter may name.
var sessionStates = []string{"staged", "launching", "running", "paused", "stopping", "exited"}

// psFilterKeys are the keys --filter knows, each with what it matches.
var psFilterKeys = []string{"capsule", "label", "name", "parent", "state", "status"}

func (a *app) psCommand() *cobra.Command {
	var all, asJSON, quiet, tree, noTrunc, fleet bool
	var nodes []string
	var format string
	var filters []string
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List sessions (staged and live by default)",
		Long: `ps lists sessions that are staged or live, newest first; --all adds those that
have ended. With --tree each child a session spawned is listed under its parent (children
in the order they were spawned, the top-level sessions newest first).

The ID column is the session's short id: the last 12 hex digits of its id, which are
random (an id begins with its creation time, so the ids of sessions staged close together
share their start). Should two listed sessions share them, both are shown longer. Every
command takes a short id (or 4 or more of its first digits), a name, a full id or a unique
id prefix ("ses_" and 4 or more characters). --no-trunc shows full ids.

--filter KEY=VALUE selects sessions; give it more than once, or comma-separated. Filters on
one key widen the selection (any may match), on different keys narrow it (all must); label
filters narrow it each (every one must match, as docker's):
  state=STATE           staged, launching, running, paused, stopping or exited; a state
                        filter lists ended sessions without --all; status=STATE
                        is the same filter (docker's name for it)
  capsule=NAME[@VER]    the capsule's name, and its version when given
  parent=SESSION        the children of a session (a name, an id or a short id)
  name=GLOB             the session's name, as a shell pattern (* ? [a-z])
  label=KEY=VALUE       the session's label KEY has VALUE (run|stage --label); label=KEY:
                        it has the label KEY, whatever its value. roostd selects them

--format json prints a JSON array of the objects inspect --json prints (--json is the
same); --format '{{.id}}' prints a Go template over each of those objects, one line each
(keys are snake_case: {{.capsule.name}}, {{.state}}; {{short .id}} is the short id,
{{json .}} the object, {{index .labels "team"}} one label, empty where it is not set).
-q prints full ids only. Every format lists newest first.

--fleet lists the sessions of every node of the fleet instead, from the fleet's session
directory in etcd, which each node keeps up to date (within a fraction of a second of each
change, when it reaches etcd): by node, then oldest first, with full ids. A node that is
not heard now (cut off from etcd, stopped or down) is said on stderr, and its sessions are
listed as it last wrote them; a session of a node forgotten with fleet node forget is
"lost", with the state it was in. --fleet takes --all, --json, --quiet and --node NAME
(repeatable: only those nodes' sessions); it needs a roostd that is a fleet node.`,
		Example: `  roostctl ps
  roostctl ps --all --filter state=exited,capsule=hello
  roostctl ps --filter 'name=build-*' --format '{{.id}} {{.name}} {{.state}}'
  roostctl ps --all --filter label=team=a --format '{{.id}} {{index .labels "run"}}'
  roostctl stop $(roostctl ps -q --filter capsule=agent@0.2.0)
  roostctl ps --fleet --all`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fleet {
				for _, flag := range []string{"tree", "no-trunc", "filter"} {
					if cmd.Flags().Changed(flag) {
						return usageError{fmt.Errorf("--fleet and --%s: --fleet takes --all, --json and --quiet only", flag)}
					}
				}
				if cmd.Flags().Changed("format") && format != "json" {
					return usageError{fmt.Errorf("--fleet and --format %q: --fleet prints a table, or JSON with --json", format)}
				}
				return a.psFleet(cmd, all, asJSON || format == "json", quiet, nodes)
			}
			if len(nodes) > 0 {
				return usageError{errors.New("--node: only with --fleet (without it, ps lists the node asked)")}
			}
			if asJSON {
				if cmd.Flags().Changed("format") && format != "json" {
					return usageError{fmt.Errorf("--json and --format %q: give one (--json is --format json)", format)}
				}
				format = "json"
			}
			var tmpl *template.Template
			switch format {
			case "", "table", "json":
			default:
				var err error
				if tmpl, err = sessionTemplate(format); err != nil {
					return err
				}
			}
			f, err := parsePSFilters(filters)
			if err != nil {
				return err
			}
			c, err := a.sessions()
			if err != nil {
				return err
			}
			if f.parents != nil {
				// Resolved by roostd, once, as every other command resolves a session.
				for ref := range f.parents {
					resp, err := c.Get(cmd.Context(), &roostv1.GetRequest{Id: ref})
					if err != nil {
						return fmt.Errorf("--filter parent=%s: %s", ref, status.Convert(err).Message())
					}
					f.parentIDs = append(f.parentIDs, resp.GetSession().GetId())
				}
			}
			// A state filter decides by itself which states are listed.
			resp, err := c.List(cmd.Context(), &roostv1.ListRequest{All: all || len(f.states) > 0, Label: f.labels})
			if err != nil {
				if status.Code(err) == codes.InvalidArgument && len(f.labels) > 0 {
					return usageError{fmt.Errorf("--filter: %s", status.Convert(err).Message())}
				}
				return err
			}
			var rows []*roostv1.Session
			for _, s := range resp.GetSessions() {
				if f.match(s) {
					rows = append(rows, s)
				}
			}
			sortNewestFirst(rows)
			out := cmd.OutOrStdout()
			switch {
			case quiet:
				for _, s := range rows {
					fmt.Fprintln(out, s.GetId())
				}
				return nil
			case format == "json":
				return printJSONList(out, rows)
			}
			shorts := shortIDs(rows)
			prefixes := make([]string, len(rows))
			if tree {
				rows, prefixes = asTree(rows)
			}
			if tmpl != nil {
				return executeTemplate(out, tmpl, rows, shorts)
			}
			table := [][]string{{"ID", "NAME", "CAPSULE", "STATE", "CLASS", "CREATED", "DETAIL"}}
			for i, s := range rows {
				id := shorts[s.GetId()]
				if noTrunc {
					id = s.GetId()
				}
				table = append(table, []string{prefixes[i] + id, orDash(s.GetName()), s.GetCapsule().GetName() + "@" + s.GetCapsule().GetVersion(),
					outcome(s), orDash(s.GetContainment().GetAchieved()), ago(s.GetCreatedAt()), s.GetDetail()})
			}
			return writeTable(out, table)
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include sessions that have ended")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of session records (--format json)")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print full session ids only")
	cmd.Flags().BoolVar(&tree, "tree", false, "list children under their parents")
	cmd.Flags().BoolVar(&noTrunc, "no-trunc", false, "show full session ids")
	cmd.Flags().BoolVar(&fleet, "fleet", false, "list the sessions of every node of the fleet, from its session directory")
	cmd.Flags().StringArrayVar(&nodes, "node", nil, "with --fleet: only the sessions of node `NAME` (repeatable)")
	cmd.Flags().StringVar(&format, "format", "", "print `FORMAT`: table (the default), json, or a Go template such as '{{.id}}'")
	cmd.Flags().StringArrayVar(&filters, "filter", nil, "select sessions by `KEY=VALUE` (repeatable, comma-separated); keys: "+strings.Join(psFilterKeys, ", "))
	return cmd
}

// psFilter is what --filter selects; a nil set does not filter.
type psFilter struct {
	states   map[string]bool
	capsules []string
	names    []string
	// labels are label selectors roostd matches (ListRequest.label).
	labels []string
	// parents are the SESSION arguments, resolved into parentIDs before matching.
	parents   map[string]bool
	parentIDs []string
}

func parsePSFilters(args []string) (*psFilter, error) {
	f := &psFilter{}
	for _, arg := range args {
		for kv := range strings.SplitSeq(arg, ",") {
			key, value, ok := strings.Cut(kv, "=")
			if !ok || value == "" {
				return nil, usageError{fmt.Errorf("--filter %q: give KEY=VALUE, KEY one of %s", kv, strings.Join(psFilterKeys, ", "))}
			}
			switch key {
			case "state", "status": // status as docker ps names it
				if !slices.Contains(sessionStates, value) {
					return nil, usageError{fmt.Errorf("--filter %s=%s: not a state; the states are %s", key, value, strings.Join(sessionStates, ", "))}
				}
				if f.states == nil {
					f.states = map[string]bool{}
				}
				f.states[value] = true
			case "capsule":
				f.capsules = append(f.capsules, value)
			case "name":
				if _, err := path.Match(value, ""); err != nil {
					return nil, usageError{fmt.Errorf("--filter name=%s: not a pattern: %v", value, err)}
				}
				f.names = append(f.names, value)
			case "label":
				f.labels = append(f.labels, value)
			case "parent":
				if f.parents == nil {
					f.parents = map[string]bool{}
				}
				f.parents[value] = true
			default:
				return nil, usageError{fmt.Errorf("--filter %q: unknown key %q; the keys are %s", kv, key, strings.Join(psFilterKeys, ", "))}
			}
		}
	}
	return f, nil
}

func (f *psFilter) match(s *roostv1.Session) bool {
	if f.states != nil && !f.states[s.GetState()] {
		return false
	}
	if f.capsules != nil && !slices.ContainsFunc(f.capsules, func(c string) bool {
		name, version, versioned := strings.Cut(c, "@")
		return s.GetCapsule().GetName() == name && (!versioned || s.GetCapsule().GetVersion() == version)
	}) {
		return false
	}
	if f.names != nil && !slices.ContainsFunc(f.names, func(glob string) bool {
		ok, _ := path.Match(glob, s.GetName())
		return ok && s.GetName() != ""
	}) {
		return false
	}
	if f.parents != nil && !slices.Contains(f.parentIDs, s.GetParentId()) {
		return false
	}
	return true
}

// shortIDs gives each session its short id, the last shortIDLen hex digits of its id, or
// more of them where two listed sessions share those: a short id shown is unique in the
// listing, and roostd resolves every length of it.
func shortIDs(list []*roostv1.Session) map[string]string {
	hex := func(id string) string { return strings.TrimPrefix(id, "ses_") }
	tail := shortID
	out := make(map[string]string, len(list))
	groups := map[string][]string{}
	for _, s := range list {
		groups[tail(s.GetId(), shortIDLen)] = append(groups[tail(s.GetId(), shortIDLen)], s.GetId())
	}
	for short, ids := range groups {
		if len(ids) == 1 {
			out[ids[0]] = short
			continue
		}
		// Rare (48 random bits): lengthen each until it is unique among those it collided
		// with.
		for _, id := range ids {
			n := shortIDLen
			for ; n < len(hex(id)); n++ {
				if !slices.ContainsFunc(ids, func(o string) bool { return o != id && strings.HasSuffix(o, tail(id, n)) }) {
					break
				}
			}
			out[id] = tail(id, n)
		}
	}
	return out
}

// shortID is the last n hex digits of a session id (the whole id when it has no more).
func shortID(id string, n int) string {
	if h := strings.TrimPrefix(id, "ses_"); len(h) > n {
		return h[len(h)-n:]
	}
	return id
}

// sortNewestFirst orders sessions by creation, newest first; ids, which are time-ordered,
// break ties.
func sortNewestFirst(list []*roostv1.Session) {
	sort.SliceStable(list, func(i, j int) bool {
		a, b := list[i].GetCreatedAt().AsTime(), list[j].GetCreatedAt().AsTime()
		if !a.Equal(b) {
			return a.After(b)
		}
		return list[i].GetId() > list[j].GetId()
	})
}

// sessionTemplate parses a --format template, with the functions docker's offers that make
// sense here, and short.
func sessionTemplate(text string) (*template.Template, error) {
	if !strings.Contains(text, "{{") {
		return nil, usageError{fmt.Errorf("--format %q: give table, json or a Go template such as '{{.id}} {{.state}}'", text)}
	}
	funcs := template.FuncMap{
		"json": func(v any) (string, error) {
			data, err := json.Marshal(v)
			return string(data), err
		},
		"join":  func(v []any, sep string) string { return joinAny(v, sep) },
		"lower": strings.ToLower,
		"upper": strings.ToUpper,
		// Replaced per listing (executeTemplate); declared here so parsing knows it.
		"short": func(string) string { return "" },
	}
	t, err := template.New("format").Option(templateOption).Funcs(funcs).Parse(text)
	if err != nil {
		return nil, usageError{fmt.Errorf("--format: %v", err)}
	}
	return t, nil
}

func joinAny(v []any, sep string) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, sep)
}

// executeTemplate prints the template over each session's JSON object (what inspect --json
// prints), one line each: the keys scripts already know, nothing new to learn.
func executeTemplate(out io.Writer, t *template.Template, rows []*roostv1.Session, shorts map[string]string) error {
	t = t.Funcs(template.FuncMap{"short": func(id string) string {
		if s, ok := shorts[id]; ok {
			return s
		}
		return id
	}})
	var buf, line bytes.Buffer
	for _, s := range rows {
		obj, err := templateObject(s)
		if err != nil {
			return err
		}
		line.Reset()
		if err := t.Execute(&line, obj); err != nil {
			return usageError{fmt.Errorf("--format: %w", err)}
		}
		// A field the object lacks (exit_code before the end) prints as nothing: text/template
		// writes "<no value>" for a nil value.
		buf.Write(bytes.ReplaceAll(line.Bytes(), []byte("<no value>"), nil))
		buf.WriteByte('\n')
	}
	_, err := out.Write(buf.Bytes())
	return err
}

// templateObject is m's JSON object for a template, with every field of m's type present:
// protojson leaves out an unset message or optional field, and a template run with
// missingkey=error must refuse only a key that is no field at all ({{.nmae}}).
func templateObject(m proto.Message) (map[string]any, error) {
	data, err := marshal(m)
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	// Numbers stay as written (exit_code 3, not 3e+00).
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	addFields(obj, m.ProtoReflect().Descriptor(), 0)
	return obj, nil
}

// addFields gives obj a nil value for each field of md it lacks, and an object of nils for
// each message field, to a depth that ends a type that contains itself.
func addFields(obj map[string]any, md protoreflect.MessageDescriptor, depth int) {
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := fd.TextName()
		v, ok := obj[name]
		if fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap() && !wellKnown(fd.Message()) {
			sub, isObj := v.(map[string]any)
			if !ok && depth < 4 {
				sub, isObj = map[string]any{}, true
				obj[name] = sub
			}
			if isObj {
				addFields(sub, fd.Message(), depth+1)
			}
			continue
		}
		if !ok {
			obj[name] = nil
		}
	}
}

// wellKnown is a message protojson writes as a value of its own (a timestamp as a string).
func wellKnown(md protoreflect.MessageDescriptor) bool {
	return md.ParentFile().Package() == "google.protobuf"
}

// templateOption makes a key that is no field an error naming it, not an empty column.
const templateOption = "missingkey=error"

// writeTable prints rows as aligned columns two spaces apart, with no trailing spaces (an
// empty last cell would leave tabwriter's padding at the end of the line).
func writeTable(w io.Writer, rows [][]string) error {
	var widths []int
	for _, r := range rows {
		for i, cell := range r {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	var buf bytes.Buffer
	for _, r := range rows {
		var line strings.Builder
		for i, cell := range r {
			line.WriteString(cell)
			if i < len(r)-1 {
				line.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell)+2))
			}
		}
		buf.WriteString(strings.TrimRight(line.String(), " "))
		buf.WriteByte('\n')
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// asTree orders sessions depth first, each child under its parent, and gives each row the
// prefix that draws the tree. A session whose parent is not listed is a root. Roots come
// newest first; children in the order they were spawned, under their parent.
func asTree(list []*roostv1.Session) ([]*roostv1.Session, []string) {
	listed := map[string]bool{}
	for _, s := range list {
		listed[s.GetId()] = true
	}
	kids := map[string][]*roostv1.Session{}
	var roots []*roostv1.Session
	for _, s := range list {
		if p := s.GetParentId(); p != "" && listed[p] {
			kids[p] = append(kids[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	sortNewestFirst(roots)
	var rows []*roostv1.Session
	var prefixes []string
	var walk func(s *roostv1.Session, lead, branch string)
	walk = func(s *roostv1.Session, lead, branch string) {
		rows = append(rows, s)
		prefixes = append(prefixes, lead+branch)
		children := kids[s.GetId()]
		next := lead
		switch branch {
		case "├─ ":
			next += "│  "
		case "└─ ":
			next += "   "
		}
		for i, c := range children {
			b := "├─ "
			if i == len(children)-1 {
				b = "└─ "
			}
			walk(c, next, b)
		}
	}
	for _, r := range roots {
		walk(r, "", "")
	}
	return rows, prefixes
}

// psFleet prints the fleet's sessions as the session directory holds them.
func (a *app) psFleet(cmd *cobra.Command, all, asJSON, quiet bool, nodes []string) error {
	c, err := a.sessions()
	if err != nil {
		return err
	}
	resp, err := c.ListFleet(cmd.Context(), &roostv1.ListFleetRequest{All: all, Node: nodes})
	if err != nil {
		return err
	}
	for _, n := range resp.GetUnreachableNodes() {
		fmt.Fprintf(cmd.ErrOrStderr(), "node %s is unreachable: its sessions are as it last wrote them\n", n)
	}
	out := cmd.OutOrStdout()
	switch {
	case quiet:
		for _, s := range resp.GetSessions() {
			fmt.Fprintln(out, s.GetId())
		}
		return nil
	case asJSON:
		return printJSONList(out, resp.GetSessions())
	}
	table := [][]string{{"SESSION ID", "NAME", "NODE", "STATE", "CAPSULE", "CREATED"}}
	for _, s := range resp.GetSessions() {
		state := s.GetState()
		if s.GetLastState() != "" {
			state += " (was " + s.GetLastState() + ")"
		}
		table = append(table, []string{s.GetId(), orDash(s.GetName()), s.GetNode(), state, s.GetCapsule(), ago(s.GetCreatedAt())})
	}
	return writeTable(out, table)
}
