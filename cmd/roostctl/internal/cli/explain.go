package cli

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func (a *app) explainCommand() *cobra.Command {
	var containment string
	var deadline time.Duration
	var asJSON, oci bool
	cmd := &cobra.Command{
		Use:   "explain CAPSULE|NAME@VERSION|SESSION",
		Short: "Show a capsule's effective grants and containment, without running it, or a session's",
		Long: `explain reads CAPSULE as stage would and prints what a session of it would get: the
containment floor and where it comes from, the class this host delivers (or why it
cannot), and every grant with its resolved value and what enforces it. Nothing is
recorded. The JSON form is what a session's trace.jsonl records as session_start.

explain SESSION (its name, its id or a unique prefix of it) prints the same of a session
that was staged: what roostd decided then and recorded, which the host or roostd's
configuration may no longer decide alike. A path that exists, or NAME@VERSION, is a
capsule; any other argument is a session.

With --oci it prints instead the OCI runtime spec (config.json) a sealed session of the
capsule runs with, as another runtime (runc, crun) would take it; paths name a session
called SESSION. --oci, --containment and --deadline are for a capsule only.`,
		Example: `  roostctl explain ./capsule
  roostctl explain hello@0.1.0 --containment sealed
  roostctl explain web                  # what session web was staged with
  roostctl explain --json ses_0193 | jq .policy.limits`,
		Args: exactArgs(1, "one CAPSULE or SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !isCapsuleRef(args[0]) {
				for _, flag := range []string{"oci", "containment", "deadline"} {
					if cmd.Flags().Changed(flag) {
						return usageError{fmt.Errorf("--%s explains a capsule, and %q is no path here nor NAME@VERSION; a session is explained as it was staged, without --oci, --containment or --deadline", flag, args[0])}
					}
				}
				return a.explainSession(cmd, args[0], asJSON)
			}
			abs, err := capsuleArg(args[0])
			if err != nil {
				return err
			}
			req := &roostv1.ExplainRequest{Capsule: abs, Containment: containment, Oci: oci}
			if deadline != 0 {
				req.Deadline = durationpb.New(deadline)
			}
			c, err := a.capsules()
			if err != nil {
				return err
			}
			resp, err := c.Explain(cmd.Context(), req)
			if err != nil {
				return err
			}
			e := resp.GetExplanation()
			if oci {
				// On stderr, first: stdout stays the spec alone, for a file or another
				// runtime, while whoever reads the terminal learns it is not this
				// capsule's own class.
				if note := ociNote(e); note != "" {
					for _, line := range wrapText("roostctl: note: "+note, explainWidth(cmd.ErrOrStderr())) {
						fmt.Fprintln(cmd.ErrOrStderr(), line)
					}
				}
				fmt.Fprintln(cmd.OutOrStdout(), resp.GetOciConfig())
				return nil
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), e)
			}
			printExplanation(cmd.OutOrStdout(), e, explainWidth(cmd.OutOrStdout()))
			return nil
		},
	}
	// Set here, not by completeArgs's reading of Use: explain takes a capsule or a session,
	// and completes both.
	cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		out, directive := a.completeCapsules(cmd, args, toComplete)
		if len(args) == 0 {
			sessions, _ := a.completeSessions(cmd, args, toComplete)
			out = append(out, sessions...)
		}
		return out, directive
	}
	cmd.Flags().StringVar(&containment, "containment", "", "explain with this floor, as run --containment")
	cmd.Flags().DurationVar(&deadline, "deadline", 0, "explain with this deadline, as run --deadline")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the explanation as JSON")
	cmd.Flags().BoolVar(&oci, "oci", false, "print the OCI runtime spec (config.json) of a sealed session instead")
	return cmd
}

// isCapsuleRef says explain's argument names a capsule: NAME@VERSION (no session name has
// an @), or a path that exists. Anything else is taken for a session.
func isCapsuleRef(arg string) bool {
	if strings.Contains(arg, "@") && !strings.Contains(arg, "/") {
		return true
	}
	_, err := os.Stat(arg)
	return err == nil
}

// explainSession prints what roostd recorded of a session's explanation when it was staged.
func (a *app) explainSession(cmd *cobra.Command, ref string, asJSON bool) error {
	c, err := a.capsules()
	if err != nil {
		return err
	}
	resp, err := c.Explain(cmd.Context(), &roostv1.ExplainRequest{Session: ref})
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%s: no capsule there (no such path, and not NAME@VERSION), and %s", ref, status.Convert(err).Message())
	}
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(cmd.OutOrStdout(), resp.GetExplanation())
	}
	out := cmd.OutOrStdout()
	width := explainWidth(out)
	printSessionHead(out, resp.GetSession(), resp.GetExplanation(), width)
	printExplanation(out, resp.GetExplanation(), width)
	return nil
}

// printSessionHead says which session an explanation e is of, and what of it stage decided
// beyond the capsule: its host ids.
func printSessionHead(out io.Writer, s *roostv1.Session, e *roostv1.Explanation, width int) {
	head := s.GetId()
	if s.GetName() != "" {
		head += " (" + s.GetName() + ")"
	}
	field(out, "session", head, width)
	field(out, "state", outcome(s), width)
	field(out, "staged", s.GetCreatedAt().AsTime().Local().Format(time.RFC3339)+": what follows is what roostd decided and recorded then", width)
	if id := s.GetIdentity(); id != nil && !id.GetHostRoot() && id.GetSize() > 0 {
		// A sealed session's root maps the whole range; any other runs as its first id.
		ids := fmt.Sprintf("uid and gid %d", id.GetUid())
		if e.GetContainment().GetAchieved() == "sealed" {
			ids = fmt.Sprintf("uids and gids %d-%d", id.GetUid(), id.GetUid()+id.GetSize()-1)
		}
		field(out, "host ids", ids, width)
	}
}

// explainWidth is the width explain wraps its human output to: the terminal's, or 100
// columns when stdout is not a terminal (a pager, a file, a pipe).
func explainWidth(out io.Writer) int {
	if isTerminal(out) {
		if w, _, err := term.GetSize(int(out.(*os.File).Fd())); err == nil && w >= 40 {
			return w
		}
	}
	return 100
}

// ociNote says, when the capsule would not run sealed, that the spec shown is a sealed
// session's and what this capsule would run as instead, and why; "" when it would run sealed.
func ociNote(e *roostv1.Explanation) string {
	d := e.GetContainment()
	const shown = "the OCI spec shown is what a sealed session of this capsule would run with"
	if !d.GetFloorMet() {
		return fmt.Sprintf("%s; this capsule would not run at all here: %s", shown, d.GetShortfallReason())
	}
	if d.GetAchieved() == "sealed" {
		return ""
	}
	var from []string
	for _, s := range d.GetSources() {
		if s.GetClass() == d.GetDeclared() {
			from = append(from, s.GetSource())
		}
	}
	return fmt.Sprintf("%s, but this capsule would run %s, not sealed: its containment floor is %s (from %s), and a session runs at exactly its floor; explain --oci --containment sealed shows the spec it would run with under run --containment sealed",
		shown, d.GetAchieved(), d.GetDeclared(), strings.Join(from, ", "))
}

// labelWidth is the width of explain's labels ("capsule", "shell.allow"), the hanging
// indent of their text.
const labelWidth = 13

// field prints one labelled line, wrapped to width with the text's continuation lines
// indented under its start.
func field(out io.Writer, label, text string, width int) {
	for i, line := range wrapText(text, width-labelWidth) {
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(out, "%-*s%s\n", labelWidth, label, line)
	}
}

// wrapText breaks s at spaces into lines of at most width columns; a word longer than
// width (a digest, a path) keeps a line of its own.
func wrapText(s string, width int) []string {
	width = max(width, 20)
	var lines []string
	var cur strings.Builder
	n := 0
	for _, word := range strings.Fields(s) {
		w := utf8.RuneCountInString(word)
		if n > 0 && n+1+w > width {
			lines = append(lines, cur.String())
			cur.Reset()
			n = 0
		}
		if n > 0 {
			cur.WriteByte(' ')
			n++
		}
		cur.WriteString(word)
		n += w
	}
	if n > 0 || len(lines) == 0 {
		lines = append(lines, cur.String())
	}
	return lines
}

func printExplanation(out io.Writer, e *roostv1.Explanation, width int) {
	c := e.GetCapsule()
	d := e.GetContainment()
	field(out, "capsule", fmt.Sprintf("%s@%s  %s", c.GetName(), c.GetVersion(), c.GetSha256()), width)
	field(out, "source", c.GetSource(), width)
	var from []string
	for _, s := range d.GetSources() {
		from = append(from, fmt.Sprintf("%s: %s", s.GetSource(), s.GetClass()))
	}
	field(out, "floor", fmt.Sprintf("%s  (%s)", d.GetDeclared(), strings.Join(from, ", ")), width)
	if d.GetFloorMet() {
		field(out, "achieved", d.GetAchieved(), width)
		field(out, "mechanism", d.GetMechanism(), width)
	} else {
		field(out, "achieved", "none: staging would be refused", width)
		field(out, "shortfall", d.GetShortfallReason(), width)
	}
	if st := e.GetStart(); st != nil {
		field(out, "start", st.GetPath()+": "+st.GetReason(), width)
	}
	if id := e.GetIdentity(); id != nil {
		switch {
		case id.GetHostRoot():
			field(out, "runs as", "host root: roostd's sessions.allow_root names this capsule", width)
		case d.GetAchieved() == "sealed" || !d.GetFloorMet() && d.GetDeclared() == "sealed":
			field(out, "runs as", fmt.Sprintf("root in a user namespace mapping ids 0-%d onto a host uid range of its own (allocated at stage; a warm start takes its sandbox's)", id.GetSize()-1), width)
		default:
			field(out, "runs as", "an unprivileged host uid of its own (allocated at stage), no capabilities, no_new_privs", width)
		}
	}
	// One item a line: each is a sentence of its own, and stays whole when it fits.
	for i, r := range e.GetReadable() {
		field(out, map[bool]string{true: "reads"}[i == 0], r, width)
	}
	for i, x := range e.GetExecutable() {
		field(out, map[bool]string{true: "executes"}[i == 0], x, width)
	}
	for i, sh := range e.GetShell() {
		label := ""
		if i == 0 {
			label = "shell.allow"
		}
		what := append(slices.Clone(sh.GetFiles()), sh.GetTrees()...)
		for j := len(sh.GetFiles()); j < len(what); j++ {
			what[j] += "/ (tree)"
		}
		field(out, label, fmt.Sprintf("%s → %s", sh.GetEntry(), strings.Join(what, " ")), width)
	}
	if sv := e.GetSystem(); sv != nil {
		printSystem(out, sv, width)
	}
	for i, v := range e.GetEnv() {
		label := ""
		if i == 0 {
			label = "host env"
		}
		field(out, label, fmt.Sprintf("%s: %s (%s)", v.GetName(), v.GetVerdict(), v.GetReason()), width)
	}
	fmt.Fprintln(out)
	printGrants(out, e, width)
}

// valueCap bounds the VALUE column: a longer value (a long list) pushes its row's HOW to
// the next line rather than widening every row.
const valueCap = 30

// printGrants prints the grant table: KEY, VALUE and ENFORCEMENT in columns, HOW wrapped
// to width beneath its own column.
func printGrants(out io.Writer, e *roostv1.Explanation, width int) {
	type row struct{ key, value, enf, how string }
	rows := []row{{"GRANT", "VALUE", "ENFORCEMENT", "HOW"}}
	for _, g := range e.GetGrants() {
		// The class's mechanism is said above; its row would say it again in other words.
		if g.GetKey() == "containment" && e.GetContainment().GetFloorMet() {
			rows = append(rows, row{g.GetKey(), g.GetValue(), orDash(g.GetEnforcement()), "the mechanism above"})
			continue
		}
		rows = append(rows, row{g.GetKey(), g.GetValue(), orDash(g.GetEnforcement()), g.GetMechanism()})
	}
	var wk, wv, we int
	for _, r := range rows {
		wk = max(wk, utf8.RuneCountInString(r.key))
		if n := utf8.RuneCountInString(r.value); n <= valueCap {
			wv = max(wv, n)
		}
		we = max(we, utf8.RuneCountInString(r.enf))
	}
	indent := wk + 2 + wv + 2 + we + 2
	how := width - indent
	if how < 30 {
		// Too narrow for a HOW column: HOW goes beneath each row, indented.
		indent, how = 4, width-4
	}
	for _, r := range rows {
		head := fmt.Sprintf("%-*s  %-*s  %-*s  ", wk, r.key, wv, r.value, we, r.enf)
		lines := wrapText(r.how, how)
		if n := utf8.RuneCountInString(head); n > indent {
			fmt.Fprintln(out, strings.TrimRight(head, " "))
			head = ""
		}
		for i, line := range lines {
			if i > 0 || head == "" {
				head = strings.Repeat(" ", indent)
			}
			fmt.Fprintln(out, head+line)
		}
	}
}

// printSystem shows what of the host's system trees the program sees: the mode, what it
// holds against, and the closure, trees first.
func printSystem(out io.Writer, sv *roostv1.SystemView, width int) {
	head := sv.GetMode()
	if sv.GetDigest() != "" {
		head += fmt.Sprintf(" — %d files, %d trees (view %.12s)", len(sv.GetFiles()), len(sv.GetTrees()), sv.GetDigest())
	}
	field(out, "system", head, width)
	field(out, "", "holds against "+sv.GetHolds(), width)
	for _, t := range sv.GetTrees() {
		field(out, "", t+"/ (tree)", width)
	}
	for _, f := range sv.GetFiles() {
		field(out, "", f, width)
	}
	for _, m := range sv.GetMissing() {
		field(out, "", "missing: "+m, width)
	}
}
