package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// docBlock is a fenced block of a page: its info string, where it starts, its text, and the
// text of the ```text block right after it (only blank lines between), which is output it
// must print.
type docBlock struct {
	info, text, output string
	line               int
}

// hostOnly is how a page marks a block the tests cannot run: it installs roost or drives
// systemd, on the host.
const hostOnly = `sh title="on the host`

func docBlocks(t *testing.T, page string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(), page))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []docBlock
	var cur *docBlock
	var body []string
	blankSince := false // only blank lines since the last block closed
	for i, l := range strings.Split(string(data), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &docBlock{info: strings.TrimPrefix(l, "```"), line: i + 1}
			body = nil
		case cur != nil && l == "```":
			cur.text = strings.Join(body, "\n") + "\n"
			if n := len(blocks); cur.info == "text" && blankSince && n > 0 && blocks[n-1].info == "sh" {
				blocks[n-1].output = cur.text
			} else {
				blocks = append(blocks, *cur)
			}
			cur, blankSince = nil, true
		case cur != nil:
			body = append(body, l)
		case strings.TrimSpace(l) != "":
			blankSince = false
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: a block that never ends", page, cur.line)
	}
	return blocks
}

// outputLine makes an expected line a pattern: the line exactly, "…" standing for any text.
func outputLine(want string) *regexp.Regexp {
	parts := strings.Split(want, "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$")
}

// runPage runs a page's ```sh blocks in order, as a reader would paste them into one
// directory, with bin/ on PATH and ROOST_SOCKET naming d. A block that fails, or does not
// print a line its ```text block shows, fails the test; so does a page with no block to run.
func runPage(t *testing.T, d *daemon, page string) {
	dir := t.TempDir()
	env := append(os.Environ(), "PATH="+binDir+":"+os.Getenv("PATH"), "ROOST_SOCKET="+d.socket)
	ran := 0
	for _, b := range docBlocks(t, page) {
		switch {
		case b.info == "sh":
		case strings.HasPrefix(b.info, hostOnly):
			continue
		case b.info == "console" || strings.HasPrefix(b.info, "sh"):
			t.Errorf("%s:%d: a block marked %q: run it (sh) or mark it %s…\"", page, b.line, b.info, hostOnly)
			continue
		default:
			continue
		}
		ran++
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", b.text)
		cmd.Dir, cmd.Env = dir, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Fatalf("%s:%d: %v\n%s\nprinted:\n%s\nroostd:\n%s", page, b.line, err, b.text, out.String(), d.log)
		}
		t.Logf("%s:%d printed:\n%s", page, b.line, out.String())
		got := strings.Split(out.String(), "\n")
		for _, want := range strings.Split(strings.TrimSuffix(b.output, "\n"), "\n") {
			if want == "" {
				continue
			}
			re, found := outputLine(want), false
			for _, l := range got {
				if re.MatchString(l) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s:%d: the page shows %q, which the block did not print:\n%s", page, b.line, want, out.String())
			}
		}
	}
	if ran == 0 {
		t.Fatalf("%s has no block to run", page)
	}
}

// TestGettingStarted runs docs/getting-started.md. Its web host is example.com; here roostd's
// egress.hosts points that name at a server in a network namespace of the test's (the
// machine may have no route out), which the page's commands cannot tell apart.
func TestGettingStarted(t *testing.T) {
	n := newTestNet(t)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "example.com, as the test serves it")
	})}
	go srv.Serve(listenIn(t, n.inet, inetAddr+":80"))
	t.Cleanup(func() { srv.Close() })
	cfg := filepath.Join(t.TempDir(), "roostd.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("egress:\n  hosts:\n    example.com: %s\n  permit_cidrs: [%s/32]\n", inetAddr, inetAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	runPage(t, netDaemon(t, n, cfg), "docs/getting-started.md")
}

// TestReadmeFirstCapsule runs README.md's first capsule.
func TestReadmeFirstCapsule(t *testing.T) {
	runPage(t, newDaemon(t), "README.md")
}
