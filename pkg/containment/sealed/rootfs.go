package sealed

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/resolver"
)

// usrLinks are the top-level directories a merged-/usr host keeps as symlinks into /usr.
var usrLinks = []string{"bin", "sbin", "lib", "lib64"}

// etcBindCandidates are host /etc entries a sealed root needs read-only, when they exist:
// TLS certificates and the alternatives some /usr/bin links point through.
var etcBindCandidates = []string{"/etc/ssl/certs", "/etc/pki/tls/certs", "/etc/alternatives"}

// hostShape reads how this host lays out its root.
func hostShape() (merged bool, etcBinds []string) {
	merged = true
	for _, d := range usrLinks {
		target, err := os.Readlink("/" + d)
		if err != nil {
			if _, statErr := os.Lstat("/" + d); statErr == nil {
				merged = false
			}
			continue
		}
		if strings.TrimPrefix(target, "/") != "usr/"+d {
			merged = false
		}
	}
	for _, e := range etcBindCandidates {
		if info, err := os.Stat(e); err == nil && info.IsDir() {
			etcBinds = append(etcBinds, e)
		}
	}
	return merged, etcBinds
}

// composeRoot lays out a sealed session's root in dir: the /usr symlinks (or mount points
// for them), a generated /etc, and a mount point for everything OCISpec mounts. The root
// is mounted read-only, so everything here is fixed for the session's life.
func composeRoot(dir string, l Layout) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range usrLinks {
		if l.MergedUsr {
			if err := os.Symlink("usr/"+d, filepath.Join(dir, d)); err != nil {
				return err
			}
		} else if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	dirs := []string{"usr", "proc", "dev", "tmp", "work", "capsule", "etc", ".roost", "run", "root"}
	if viewHasOpt(l) {
		dirs = append(dirs, "opt")
	}
	for _, e := range l.EtcBinds {
		dirs = append(dirs, strings.TrimPrefix(e, "/"))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	// Mount points for the host trees the session reads (the root is read-only once made).
	for _, h := range l.HostRead {
		if err := mountPoint(dir, h); err != nil {
			return fmt.Errorf("mount point for %s: %w", h, err)
		}
	}
	// The bind targets for roost-init, the WASM runner and a compiled module are files.
	for _, name := range []string{containment.InitName, filepath.Base(RunnerPath), filepath.Base(WasmModule)} {
		if err := os.WriteFile(filepath.Join(dir, ".roost", name), nil, 0o555); err != nil {
			return err
		}
	}
	etc := filepath.Join(dir, "etc")
	files := map[string]string{
		// A session binds its own over it (Layout.Passwd): this is what a rehearsal sees.
		"passwd":        passwd("/bin/sh"),
		"os-release":    osRelease(hostOSRelease()),
		"group":         "root:x:0:\nnogroup:x:65534:\n",
		"hostname":      "roost\n",
		"hosts":         "127.0.0.1\tlocalhost roost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
		// A sealed session has only loopback, and its own resolver there (pkg/resolver).
		"resolv.conf": resolver.ResolvConf,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	// The dynamic loader finds multiarch libraries through its cache; copy it (and the
	// zone, a link) so programs start as they do on the host. Protocol and service names
	// are what getaddrinfo and friends look up (Python's socket, Node's net, curl).
	for _, f := range []string{"ld.so.cache", "protocols", "services"} {
		if err := copyFile(filepath.Join("/etc", f), filepath.Join(etc, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if target, err := os.Readlink("/etc/localtime"); err == nil && strings.HasPrefix(target, "/usr/") {
		if err := os.Symlink(target, filepath.Join(etc, "localtime")); err != nil {
			return err
		}
	}
	return nil
}

// passwd is a sealed root's user database, root's login shell shell. root, the user
// namespace's, is the session's only user; nobody is whom an unmapped uid shows as.
func passwd(shell string) string {
	return "root:x:0:0:root:" + Home + ":" + shell + "\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
}

// osReleaseFiles are where a host says what it is (os-release(5)): the first that exists.
var osReleaseFiles = []string{"/etc/os-release", "/usr/lib/os-release"}

// hostOSRelease is the host's os-release, "" when it has none.
func hostOSRelease() string {
	for _, f := range osReleaseFiles {
		if data, err := os.ReadFile(f); err == nil {
			return string(data)
		}
	}
	return ""
}

// osRelease is a sealed root's /etc/os-release, made from the host's (host): the root is
// roost's, not the distribution's (ID=roost), and is like the host's (ID_LIKE, the host's
// ID and its own ID_LIKE), holding the host's release's programs, whose version fields it
// keeps. A host without one gives a root that says only what it is.
func osRelease(host string) string {
	fields := map[string]string{}
	for _, line := range strings.Split(host, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		fields[k] = unquote(v)
	}
	out := "NAME=\"roost\"\nID=roost\n"
	if like := strings.TrimSpace(fields["ID"] + " " + fields["ID_LIKE"]); like != "" {
		out += "ID_LIKE=" + quote(like) + "\n"
	}
	pretty := "roost sealed session"
	if p := fields["PRETTY_NAME"]; p != "" {
		pretty += " on " + p
	}
	out += "PRETTY_NAME=" + quote(pretty) + "\n"
	for _, k := range []string{"VERSION_ID", "VERSION", "VERSION_CODENAME", "BUILD_ID"} {
		if v := fields[k]; v != "" {
			out += k + "=" + quote(v) + "\n"
		}
	}
	return out
}

// unquote is an os-release value as it reads: its quotes off, its escapes undone.
func unquote(v string) string {
	if len(v) < 2 || (v[0] != '"' && v[0] != '\'') || v[len(v)-1] != v[0] {
		return v
	}
	v = v[1 : len(v)-1]
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// quote is an os-release value: in double quotes when it holds more than letters, digits,
// dots, dashes and underscores, with the characters os-release(5) escapes escaped.
func quote(v string) string {
	if strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == "" {
		return v
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "`", "\\`", `$`, `\$`)
	return `"` + r.Replace(v) + `"`
}

// viewHasOpt says whether the session's view of the system trees holds some of /opt: its
// root then needs a mount point for it, which the shared root has not.
func viewHasOpt(l Layout) bool {
	if l.System == nil {
		return false
	}
	_, err := os.Stat(filepath.Join(l.System.Dir, "opt"))
	return err == nil
}

// mountPoint makes, in the root at dir, what host path h is bound over: a directory, or an
// empty file for a file. Under /usr (and its links) the host's tree is there already.
func mountPoint(dir, h string) error {
	if h == "/usr" || strings.HasPrefix(h, "/usr/") {
		return nil
	}
	target := filepath.Join(dir, h)
	info, err := os.Stat(h)
	if err != nil {
		return err
	}
	if info.IsDir() {
		return os.MkdirAll(target, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o444)
	if err != nil {
		return err
	}
	return f.Close()
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
