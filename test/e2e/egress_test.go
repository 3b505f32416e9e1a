package e2e

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"roost.dev/roost/internal/testenv"
)

// The egress tests' network: nothing here ever leaves the machine. The test makes two
// network namespaces joined by a veth pair and no route beyond them: "inet", where the
// test's servers listen on 10.213.0.2 (the only "internet" there is), and "daemon", where
// roostd runs (10.213.0.1) — so its proxy and resolver can reach nothing but inet, and a
// refusal with a bug (SSRF to 169.254.169.254, to loopback) sends nothing anywhere real.

const (
	inetAddr   = "10.213.0.2"
	daemonAddr = "10.213.0.1"
	// webBody is what web.test answers /hello with.
	webBody = "hello from web.test\n"
)

// testNet is the two namespaces, by path.
type testNet struct {
	daemon, inet string
}

func run(t *testing.T, argv ...string) {
	t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

func newTestNet(t *testing.T) *testNet {
	t.Helper()
	testenv.NeedRoot(t, "network namespaces need root")
	id := strconv.Itoa(os.Getpid() % 100000)
	d, i := "roost-e2e-d"+id, "roost-e2e-i"+id
	run(t, "ip", "netns", "add", d)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", d).Run() })
	run(t, "ip", "netns", "add", i)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", i).Run() })
	// Made inside the namespaces: the host's own never holds either end.
	vd, vi := "rd"+id, "ri"+id
	run(t, "ip", "-n", d, "link", "add", vd, "type", "veth", "peer", "name", vi, "netns", i)
	run(t, "ip", "-n", d, "addr", "add", daemonAddr+"/24", "dev", vd)
	run(t, "ip", "-n", i, "addr", "add", inetAddr+"/24", "dev", vi)
	for _, ns := range []string{d, i} {
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", d, "link", "set", vd, "up")
	run(t, "ip", "-n", i, "link", "set", vi, "up")
	return &testNet{daemon: "/run/netns/" + d, inet: "/run/netns/" + i}
}

// inNetNS runs fn on a thread in the network namespace at ns, then brings the thread back:
// the sockets fn makes stay in ns.
func inNetNS(ns string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		// The thread is left locked (and so ends with the goroutine) if it cannot go back.
		runtime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- err
			return
		}
		defer host.Close()
		target, err := os.Open(ns)
		if err != nil {
			done <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		ferr := fn()
		if err := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// listenIn listens on addr inside the network namespace at ns; the socket stays there.
func listenIn(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := inNetNS(ns, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// testCA makes a CA and a certificate it signs for names; it returns the CA's PEM and the
// server's certificate.
func testCA(t *testing.T, names ...string) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "roost e2e CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// inetServers starts, in inet: web.test on :80 (HTTP) and :443 (TLS, certificate from the
// returned CA), and git smart HTTP on :8080 serving repo.git, whose README holds readme.
func inetServers(t *testing.T, n *testNet, readme string) (caPEM []byte) {
	t.Helper()
	web := http.NewServeMux()
	web.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, webBody) })
	web.HandleFunc("/bytes/{n}", func(w http.ResponseWriter, r *http.Request) {
		size, _ := strconv.Atoi(r.PathValue("n"))
		w.Write(make([]byte, size))
	})
	serve := func(ln net.Listener, h http.Handler) {
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
	serve(listenIn(t, n.inet, inetAddr+":80"), web)
	caPEM, cert := testCA(t, "web.test", "other.test")
	serve(tls.NewListener(listenIn(t, n.inet, inetAddr+":443"), &tls.Config{Certificates: []tls.Certificate{cert}}), web)

	root := t.TempDir()
	src := filepath.Join(root, "src")
	run(t, "git", "init", "-q", src)
	if err := os.WriteFile(filepath.Join(src, "README"), []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "git", "-C", src, "add", "README")
	run(t, "git", "-C", src, "-c", "user.name=roost", "-c", "user.email=roost@example.invalid", "commit", "-q", "-m", "first")
	run(t, "git", "clone", "-q", "--bare", src, filepath.Join(root, "repo.git"))
	serve(listenIn(t, n.inet, inetAddr+":8080"), &cgi.Handler{Path: "/usr/lib/git-core/git-http-backend",
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}})
	return caPEM
}

// egressConfig is roostd's --config: the test's names, one of them pointing at inet, two at
// special-purpose addresses the proxy must refuse; inet's range opened.
func egressConfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "roostd.yaml")
	cfg := fmt.Sprintf(`egress:
  hosts:
    web.test: %[1]s
    git.test: %[1]s
    other.test: %[1]s
    loop.test: 127.0.0.1
    metadata.test: 169.254.169.254
  permit_cidrs: [10.213.0.0/24]
`, inetAddr)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// egressProbes is a capsule's script: each probe prints "NAME: CODE [DENIED-HEADER] exit=N
// body=BODY" (for CONNECT, CODE is the proxy's answer to it).
const egressProbes = `set +e
t=${TMPDIR:-/tmp}
echo "env: $HTTP_PROXY $HTTPS_PROXY $ALL_PROXY $NO_PROXY"
probe() {
  name=$1; w=$2; shift 2
  r=$(curl -s -o "$t/body" -w "$w [%header{x-roost-denied}]" --max-time 20 "$@"); e=$?
  echo "$name: $r exit=$e body=$(cat "$t/body" 2>/dev/null)"
  rm -f "$t/body"
}
probe http '%{http_code}' http://web.test/hello
probe connect '%{http_code}' --cacert "$ROOST_CAPSULE_DIR/ca.pem" https://web.test/hello
probe not-allowed '%{http_code}' http://other.test/hello
probe connect-not-allowed '%{http_connect}' --cacert "$ROOST_CAPSULE_DIR/ca.pem" https://other.test/hello
probe port '%{http_code}' http://git.test/hello
probe loopback '%{http_code}' http://loop.test/hello
probe metadata '%{http_code}' http://metadata.test/latest/meta-data/
probe ip-literal '%{http_code}' http://` + inetAddr + `/hello
probe socks '%{http_code}' --proxy "$ALL_PROXY" http://web.test/hello
probe socks-denied '%{http_code}' --proxy "$ALL_PROXY" http://other.test/hello
curl -sv --noproxy '*' --max-time 5 -o /dev/null http://` + inetAddr + `/hello >"$t/direct" 2>&1; e=$?
why=; while IFS= read -r l; do case $l in "* Immediate connect fail"*|"* connect to "*) why=${l#"* "}; break;; esac; done <"$t/direct"
rm -f "$t/direct"
echo "direct: exit=$e why=$why"
(
  unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY
  git clone -q http://git.test:8080/repo.git clone-ok 2>&1; echo "git: exit=$? readme=$(cat clone-ok/README)"
  git clone -q http://other.test:8080/repo.git clone-denied 2>&1; echo "git-denied: exit=$?"
)
`

// egressCaps gives a capsule of class its probes' tools and network.allow.
func egressCaps(class string, allow ...string) string {
	return fmt.Sprintf("capabilities:\n  containment: %s\n  network:\n    allow: [%s]\n  shell:\n    allow: [curl, cat, rm, \"@git\"]\n  limits:\n    deadline_seconds: 120\n",
		class, strings.Join(allow, ", "))
}

// egressRecord is one egress line of a session's trace.jsonl.
type egressRecord struct {
	EventType string `json:"event_type"`
	Proto     string `json:"proto"`
	Host      string `json:"host"`
	Port      int    `json:"port"`
	Addr      string `json:"addr"`
	Decision  string `json:"decision"`
	Rule      string `json:"rule"`
	Reason    string `json:"reason"`
	Detail    string `json:"detail"`
	BytesUp   int64  `json:"bytes_up"`
	BytesDown int64  `json:"bytes_down"`
	// Count is how many connections the record stands for: 1 for an egress record, the
	// refusals since the previous one of its key for an egress_refused one.
	Count int64 `json:"count"`
}

// egressTrace is the egress records of a session's trace: each allowed connection, and the
// refusal counters' records (as denied, with their counts).
func egressTrace(t *testing.T, recordsDir string) []egressRecord {
	t.Helper()
	f, err := os.Open(filepath.Join(recordsDir, "trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []egressRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var r egressRecord
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		switch r.EventType {
		case "egress":
			r.Count = 1
			out = append(out, r)
		case "egress_refused":
			r.Decision = "denied"
			out = append(out, r)
		}
	}
	return out
}

// probeLine finds the line a probe printed.
func probeLine(t *testing.T, out, name string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, name+": ") {
			return l
		}
	}
	t.Errorf("no %q line in:\n%s", name, out)
	return ""
}

// The acceptance run, from a sealed and from a scoped session: through HTTP_PROXY and
// HTTPS_PROXY an allowed name answers (plain and CONNECT-tunnelled TLS); a name not allowed,
// an allowed name on a port not allowed, names the config points at loopback and at the
// metadata address, and an IP literal no rule names are refused 403 with the reason header;
// SOCKS5 (ALL_PROXY) carries curl and git clone to an allowed host and refuses the rest; a
// direct connection has no route. Every decision is in the trace and the metrics, and bytes
// match the payloads.
func TestEgress(t *testing.T) {
	n := newTestNet(t)
	readme := "roost egress e2e " + strconv.Itoa(os.Getpid()) + "\n"
	caPEM := inetServers(t, n, readme)
	d := egressDaemon(t, n)
	// The direct probe's positive control: from where roostd runs, the same curl reaches
	// inet; a session's failure to is then its namespace's, not a server that is not there.
	if out, err := exec.Command("nsenter", "--net="+n.daemon, "curl", "-sS", "--noproxy", "*", "--max-time", "5", "http://"+inetAddr+"/hello").CombinedOutput(); err != nil || string(out) != webBody {
		t.Fatalf("a direct connection from roostd's namespace to inet: %v\n%s", err, out)
	}

	before := scrape(t, d)
	var all []egressRecord
	for _, class := range []string{"sealed", "scoped"} {
		t.Run(class, func(t *testing.T) {
			dir := capsule(t, "egress-"+class, egressProbes, egressCaps(class, "web.test", `"git.test:8080"`, "loop.test", "metadata.test"))
			if err := os.WriteFile(filepath.Join(dir, "ca.pem"), caPEM, 0o644); err != nil {
				t.Fatal(err)
			}
			explain := d.ok("explain", dir)
			if !regexp.MustCompile(`network\.allow\s.*enforced`).MatchString(explain) {
				t.Errorf("explain does not hold network.allow as enforced:\n%s", explain)
			}
			res := d.ctlWithin(3*time.Minute, "run", dir)
			out := res.stdout
			t.Logf("%s session:\n%s%s", class, out, res.stderr)
			want := map[string]string{
				"http":                "200 [] exit=0 body=" + strings.TrimSpace(webBody),
				"connect":             "200 [] exit=0 body=" + strings.TrimSpace(webBody),
				"not-allowed":         "403 [not_allowed] exit=0",
				"connect-not-allowed": "403 [",
				"port":                "403 [port_not_allowed] exit=0",
				"loopback":            "403 [special_address] exit=0",
				"metadata":            "403 [special_address] exit=0",
				"ip-literal":          "403 [not_allowed] exit=0",
				"socks":               "200 [] exit=0 body=" + strings.TrimSpace(webBody),
				"git":                 "exit=0 readme=" + strings.TrimSpace(readme),
			}
			for name, prefix := range want {
				if l := probeLine(t, out, name); !strings.HasPrefix(l, name+": "+prefix) {
					t.Errorf("%s: got %q, want it to begin %q", name, l, name+": "+prefix)
				}
			}
			// The bodies of refusals name the host, the port and why.
			for name, words := range map[string][]string{
				"not-allowed": {"other.test", "80"},
				"loopback":    {"loop.test", "127.0.0.1"},
				"metadata":    {"metadata.test", "169.254.169.254"},
				"port":        {"git.test", "80"},
			} {
				l := probeLine(t, out, name)
				for _, w := range words {
					if !strings.Contains(l, w) {
						t.Errorf("%s: the refusal does not name %q: %s", name, w, l)
					}
				}
			}
			// A session's network namespace has loopback and nothing that routes to inet:
			// connect(2) fails at once with ENETUNREACH, not a refusal or a timeout.
			if l, want := probeLine(t, out, "direct"), "direct: exit=7 why=Immediate connect fail for "+inetAddr+": Network is unreachable"; l != want {
				t.Errorf("direct: got %q, want %q", l, want)
			}
			// The SOCKS refusals are the proxy's, by its reply 2 (not allowed by ruleset):
			// curl's CURLE_PROXY (97), and git saying so; "socks" and "git" above are
			// their positive controls, through the same proxy.
			if l := probeLine(t, out, "socks-denied"); l != "socks-denied: 000 [] exit=97 body=" {
				t.Errorf("socks-denied: got %q, want curl's proxy refusal (exit 97)", l)
			}
			if l := probeLine(t, out, "git-denied"); l != "git-denied: exit=128" || !strings.Contains(out, "Can't complete SOCKS5 connection to other.test. (2)") {
				t.Errorf("git-denied: got %q, want exit 128 after the proxy's reply 2", l)
			}
			if !strings.Contains(out, "env: http://127.0.0.1:7700 http://127.0.0.1:7700 socks5h://127.0.0.1:7700 127.0.0.1,localhost") {
				t.Errorf("the proxy variables are not set as they should be")
			}

			ran := d.byCapsule("egress-" + class)
			if len(ran) != 1 {
				t.Fatalf("sessions of egress-%s: %+v", class, ran)
			}
			s := d.inspect(ran[0].ID)
			recs := egressTrace(t, s.RecordsDir)
			all = append(all, recs...)
			byReason := map[string]int{}
			for _, r := range recs {
				if r.Decision == "denied" {
					byReason[r.Reason] += int(r.Count)
				}
				if r.Decision == "allowed" && (r.Addr == "" || !strings.HasPrefix(r.Addr, inetAddr+":")) {
					t.Errorf("an allowed connection went to %q: %+v", r.Addr, r)
				}
				if strings.Contains(r.Addr, "127.0.0.1") || strings.Contains(r.Addr, "169.254") {
					t.Errorf("a special-purpose address was dialled: %+v", r)
				}
			}
			for reason, atLeast := range map[string]int{"not_allowed": 5, "port_not_allowed": 1, "special_address": 2} {
				if byReason[reason] < atLeast {
					t.Errorf("trace: %d %s denials, want at least %d (%v)", byReason[reason], reason, atLeast, byReason)
				}
			}
			// The plain HTTP request's record carries its bytes on the wire: the body and the
			// status line and headers down, the request line and headers up.
			found := false
			for _, r := range recs {
				if r.Proto == "http" && r.Host == "web.test" && r.Decision == "allowed" {
					found = true
					if r.BytesDown <= int64(len(webBody)) || r.BytesUp == 0 || r.Rule != "web.test" || r.Port != 80 {
						t.Errorf("the forwarded request's record: %+v; want more than the body's %d bytes down, the request's head up, rule web.test", r, len(webBody))
					}
				}
			}
			if !found {
				t.Errorf("no record of the forwarded request in the trace: %+v", recs)
			}
			insp := d.ok("inspect", s.ID)
			if !regexp.MustCompile(`egress:\s+\d+ connection\(s\), \d+ denied`).MatchString(insp) {
				t.Errorf("inspect shows no egress totals:\n%s", insp)
			}
		})
	}

	// The metrics counted what the traces hold.
	after := scrape(t, d)
	var allowed, denied, up, down float64
	for _, r := range all {
		if r.Decision == "allowed" {
			allowed++
		} else {
			denied += float64(r.Count)
		}
		up += float64(r.BytesUp)
		down += float64(r.BytesDown)
	}
	for series, want := range map[string]float64{
		`roost_egress_connections_total{decision="allowed"}`: allowed,
		`roost_egress_connections_total{decision="denied"}`:  denied,
		`roost_egress_bytes_total{direction="up"}`:           up,
		`roost_egress_bytes_total{direction="down"}`:         down,
	} {
		if got := metricValue(after, series) - metricValue(before, series); got != want {
			t.Errorf("%s rose by %v; the traces hold %v", series, got, want)
		}
	}
}

// metricValue is a series' value in a scrape; 0 when absent.
func metricValue(scrape, series string) float64 {
	for _, l := range strings.Split(scrape, "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// A child's network.allow must be covered by its parent's (refereed at spawn), and the
// child's proxy holds it to its own, narrower, list.
func TestEgressChildNarrower(t *testing.T) {
	n := newTestNet(t)
	inetServers(t, n, "child\n")
	d := egressDaemon(t, n)
	child := `set +e
for u in http://web.test/hello http://git.test:8080/; do
  echo "$u: $(curl -s -o /dev/null -w '%{http_code} [%header{x-roost-denied}]' --max-time 20 "$u")"
done`
	d.push(capsule(t, "narrow", child, egressCaps("sealed", "web.test")))
	d.push(capsule(t, "wide", child, egressCaps("sealed", "web.test", "other.test")))
	parent := capsule(t, "parent", apiShell+`
echo "narrow: $(api -o /dev/null -w '%{http_code}' -d '{"capsule":"narrow","version":"0.1.0","wait":true}' "$ROOST_ENDPOINT/v1/spawn")"
echo "wide: $(api -o /dev/null -w '%{http_code}' -d '{"capsule":"wide","version":"0.1.0","wait":true}' "$ROOST_ENDPOINT/v1/spawn")"
`, egressCaps("sealed", "web.test", `"git.test:8080"`)+"  spawn:\n    allow: [narrow, wide]\n")
	res := d.ctlWithin(2*time.Minute, "run", parent)
	if !strings.Contains(res.stdout, "narrow: 201") || !strings.Contains(res.stdout, "wide: 403") {
		t.Fatalf("spawns: the narrower child must start, the wider be refused:\n%s%s", res.stdout, res.stderr)
	}
	kids := d.byCapsule("narrow")
	if len(kids) != 1 {
		t.Fatalf("narrow children: %+v", kids)
	}
	out := d.ok("logs", kids[0].ID)
	if !strings.Contains(out, "http://web.test/hello: 200 []") || !strings.Contains(out, "http://git.test:8080/: 403 [not_allowed]") {
		t.Fatalf("the child is not held to its own list (web.test only):\n%s", out)
	}
}

// egressDaemon starts roostd in the test network's daemon namespace.
func egressDaemon(t *testing.T, n *testNet) *daemon {
	t.Helper()
	return netDaemon(t, n, egressConfig(t))
}

// netDaemon is a roostd in n's daemon namespace with --config cfg.
func netDaemon(t *testing.T, n *testNet, cfg string) *daemon {
	t.Helper()
	d := &daemon{t: t, netns: n.daemon}
	state := stateDir(t)
	d.stateDir, d.socket, d.metricsAddr, d.args = state, filepath.Join(state, "roostd.sock"), "127.0.0.1:9464", []string{"--config", cfg}
	d.start()
	t.Cleanup(func() {
		for _, id := range strings.Fields(d.ctl("ps", "-q").stdout) {
			d.ctl("kill", id)
		}
		d.cmd.Process.Signal(unix.SIGTERM)
		d.cmd.Wait()
	})
	return d
}

// resources.egress_max_bytes holds across a daemon crash: what the session carried before is
// read back from its trace, a download that crosses the bound is cut, and the next
// connection is refused.
func TestEgressBudgetSurvivesRestart(t *testing.T) {
	n := newTestNet(t)
	inetServers(t, n, "budget\n")
	d := egressDaemon(t, n)
	script := `set +e
get() { curl -s -o /dev/null -w "$1: %{http_code} %{size_download} [%header{x-roost-denied}]" --max-time 20 "http://web.test/bytes/$2"; echo " exit=$?"; }
get first 200000
while [ ! -e go ]; do sleep 0.05; done
get second 200000
get third 10
`
	dir := capsule(t, "budget", script, egressCaps("sealed", "web.test")+"  resources:\n    egress_max_bytes: 300000\n")
	if out := d.ok("explain", dir); !regexp.MustCompile(`egress_max_bytes\s+300000\s+enforced`).MatchString(out) {
		t.Errorf("explain:\n%s", out)
	}
	id := strings.TrimSpace(d.ok("run", "--detach", dir))
	s := d.inspect(id)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if recs := egressTrace(t, s.RecordsDir); len(recs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first download did not finish:\n%s", d.ctl("logs", id).stdout)
		}
	}
	d.kill9()
	d.start()
	if err := os.WriteFile(filepath.Join(s.Workdir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d.ctlWithin(time.Minute, "wait", id)
	out := d.ok("logs", id)
	if !strings.Contains(out, "first: 200 200000 [] exit=0") {
		t.Errorf("the first download, within the bound:\n%s", out)
	}
	// Cut at the bound: 100000 bytes of the second were left, give or take one buffer.
	second := regexp.MustCompile(`second: 200 (\d+) \[\] exit=(\d+)`).FindStringSubmatch(out)
	if second == nil {
		t.Fatalf("the second download:\n%s", out)
	}
	if got, _ := strconv.Atoi(second[1]); got < 100000-64<<10 || got > 100000+64<<10 || second[2] == "0" {
		t.Errorf("the second download carried %s bytes and exited %s; the bound left 100000 and it must be cut", second[1], second[2])
	}
	if !regexp.MustCompile(`third: 403 \d+ \[egress_max_bytes\] exit=0`).MatchString(out) {
		t.Errorf("a connection past the bound was not refused:\n%s", out)
	}
	var total int64
	for _, r := range egressTrace(t, s.RecordsDir) {
		total += r.BytesUp + r.BytesDown
	}
	if total > 300000+64<<10 {
		t.Errorf("the session carried %d bytes past a bound of 300000", total)
	}
}

// A session's own refusals cannot evict its allowed connections from the trace: 10,000
// refused CONNECTs (to 20 names) interleaved with 11 allowed requests, on a trace cap of
// 256 KiB the refusals alone would fill ten times over, leave every allowed request in the
// trace; the refusals are folded into egress_refused records that account for each one,
// and inspect shows both. (Before the counters the trace held the first few allowed
// requests and then egress_trace_capped.)
func TestEgressAllowedOutliveRefusals(t *testing.T) {
	n := newTestNet(t)
	inetServers(t, n, "refusals\n")
	d := egressDaemon(t, n)
	const attempts, allowed, names = 10000, 11, 20
	script := fmt.Sprintf(`import socket
def get():
    s = socket.create_connection(("127.0.0.1", 7700))
    s.sendall(b"GET http://web.test/hello HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"hello from web.test\n"), data
for i in range(%[1]d):
    if i %% 1000 == 0:
        get()
    s = socket.create_connection(("127.0.0.1", 7700))
    s.sendall(b"CONNECT h%%d.test:443 HTTP/1.1\r\nHost: h%%d.test:443\r\n\r\n" %% (i %% %[2]d, i %% %[2]d))
    assert s.recv(64).startswith(b"HTTP/1.1 403"), i
    s.close()
get()
print("flooded")
`, attempts, names)
	dir := capsule(t, "flood", "exec python3 -c '"+script+"'", egressCaps("sealed", "web.test")+"  resources:\n    log_max_bytes: 262144\n")
	capsYAML, _ := os.ReadFile(filepath.Join(dir, "capsule.yaml"))
	if err := os.WriteFile(filepath.Join(dir, "capsule.yaml"), []byte(strings.Replace(string(capsYAML), "allow: [curl, cat, rm, \"@git\"]", "allow: [\"@python\"]", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	res := d.ctlWithin(3*time.Minute, "run", dir)
	if !strings.Contains(res.stdout, "flooded") {
		t.Fatalf("the flood did not run: %+v", res)
	}
	s := d.inspect(d.byCapsule("flood")[0].ID)
	info, err := os.Stat(filepath.Join(s.RecordsDir, "trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	// The egress records stay within the bound; the rest of the trace is the start's
	// grants and the end.
	if info.Size() > 262144+64<<10 {
		t.Errorf("trace.jsonl grew to %d bytes; egress records are bounded by 262144", info.Size())
	}
	var gotAllowed, gotRefused int64
	perName := map[string]int64{}
	for _, r := range egressTrace(t, s.RecordsDir) {
		switch {
		case r.Decision == "allowed" && r.Host == "web.test" && r.BytesDown > int64(len(webBody)):
			gotAllowed++
		case r.Decision == "denied" && r.Reason == "not_allowed" && r.Port == 443:
			gotRefused += r.Count
			perName[r.Host] += r.Count
		default:
			t.Errorf("an egress record the session did not make: %+v", r)
		}
	}
	if gotAllowed != allowed {
		t.Errorf("the trace holds %d of the %d allowed requests", gotAllowed, allowed)
	}
	if gotRefused != attempts || len(perName) != names || perName["h0.test"] != attempts/names {
		t.Errorf("the trace accounts for %d of %d refusals: %v", gotRefused, attempts, perName)
	}
	insp := d.ok("inspect", s.ID)
	if !strings.Contains(insp, fmt.Sprintf("%d connection(s), %d denied", allowed, attempts)) ||
		!regexp.MustCompile(`refused:\s+500× h\d+\.test:443: not_allowed, last `).MatchString(insp) {
		t.Errorf("inspect does not show the allowed connections and the refusals by host:\n%s", insp)
	}
	var js struct {
		Egress struct {
			Connections string `json:"connections"`
			Denied      string `json:"denied"`
			Refused     []struct {
				Host   string `json:"host"`
				Port   int    `json:"port"`
				Reason string `json:"reason"`
				Count  string `json:"count"`
			} `json:"refused"`
		} `json:"egress"`
	}
	if err := json.Unmarshal([]byte(d.ok("inspect", "--json", s.ID)), &js); err != nil {
		t.Fatal(err)
	}
	if e := js.Egress; e.Connections != strconv.Itoa(allowed) || e.Denied != strconv.Itoa(attempts) || len(e.Refused) != names ||
		e.Refused[0].Count != strconv.Itoa(attempts/names) || e.Refused[0].Port != 443 || e.Refused[0].Reason != "not_allowed" {
		t.Errorf("inspect --json egress: %+v", e)
	}
}

// resources.egress_max_bytes holds across a daemon crash after the trace's cap: the trace
// stops taking records at its cap (here after a few small requests), the download past it
// is in the checkpoint only, and after a kill -9 and a restart the budget goes on from
// there — the next download is cut where it ran out and the one after is refused — rather
// than from what the capped trace holds.
func TestEgressBudgetSurvivesRestartPastTraceCap(t *testing.T) {
	n := newTestNet(t)
	inetServers(t, n, "budget\n")
	d := egressDaemon(t, n)
	script := `set +e
get() { curl -s -o /dev/null -w "$1: %{http_code} %{size_download} [%header{x-roost-denied}]" --max-time 20 "http://web.test/bytes/$2"; echo " exit=$?"; }
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do get small 10 >/dev/null; done
get first 200000
while [ ! -e go ]; do sleep 0.05; done
get second 200000
get third 10
`
	dir := capsule(t, "budget", script, egressCaps("sealed", "web.test")+"  resources:\n    egress_max_bytes: 300000\n    log_max_bytes: 4096\n")
	id := strings.TrimSpace(d.ok("run", "--detach", dir))
	s := d.inspect(id)
	// The trace is capped before the download: what it holds is far less than what the
	// session carried.
	waitFor(t, "the trace's cap", func() bool {
		data, _ := os.ReadFile(filepath.Join(s.RecordsDir, "trace.jsonl"))
		return strings.Contains(string(data), `"event_type":"egress_trace_capped"`)
	})
	// The checkpoint (written every 10 s) holds the download.
	waitFor(t, "the checkpoint of the download", func() bool {
		var cp struct {
			Used int64 `json:"used"`
		}
		data, err := os.ReadFile(filepath.Join(s.RecordsDir, "egress.json"))
		return err == nil && json.Unmarshal(data, &cp) == nil && cp.Used >= 200000
	})
	var traced int64
	for _, r := range egressTrace(t, s.RecordsDir) {
		traced += r.BytesUp + r.BytesDown
	}
	if traced >= 100000 {
		t.Fatalf("the trace holds %d bytes carried; the test needs the download past its cap", traced)
	}
	d.kill9()
	d.start()
	if err := os.WriteFile(filepath.Join(s.Workdir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d.ctlWithin(time.Minute, "wait", id)
	out := d.ok("logs", id)
	if !strings.Contains(out, "first: 200 200000 [] exit=0") {
		t.Fatalf("the first download, within the bound:\n%s", out)
	}
	// 100000 bytes of the budget were left, less the small requests' 200: the second is
	// cut there (give or take one buffer), the third refused.
	second := regexp.MustCompile(`second: 200 (\d+) \[\] exit=(\d+)`).FindStringSubmatch(out)
	if second == nil {
		t.Fatalf("the second download:\n%s", out)
	}
	if got, _ := strconv.Atoi(second[1]); got > 100000+64<<10 || second[2] == "0" {
		t.Errorf("the second download carried %s bytes and exited %s; the budget left 100000 and it must be cut", second[1], second[2])
	}
	if !regexp.MustCompile(`third: 403 \d+ \[egress_max_bytes\] exit=0`).MatchString(out) {
		t.Errorf("a connection past the budget after the restart was not refused:\n%s", out)
	}
	var js struct {
		Egress struct {
			UsedBytes string `json:"used_bytes"`
		} `json:"egress"`
	}
	if err := json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &js); err != nil {
		t.Fatal(err)
	}
	if used, _ := strconv.Atoi(js.Egress.UsedBytes); used < 290000 || used > 300000 {
		t.Errorf("inspect --json egress.used_bytes %q; the session used its budget of 300000", js.Egress.UsedBytes)
	}
}

// An address of roostd's own interfaces is the host's, as loopback is: a capsule's
// IP-literal rule naming it reaches nothing, even when the address was added after roostd
// started (roostd follows its interfaces). The address is outside the config's
// permit_cidrs; the service listening there is bound to every address, as a host's are.
// web.test through the same proxy is the positive control.
func TestEgressHostAddressRefused(t *testing.T) {
	n := newTestNet(t)
	inetServers(t, n, "hostaddr\n")
	d := egressDaemon(t, n)
	const added = "10.214.0.1"
	ns := filepath.Base(n.daemon)
	run(t, "ip", "-n", ns, "addr", "add", added+"/32", "dev", "lo")
	ln := listenIn(t, n.daemon, ":0")
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "roostd's host\n") }))
	port := ln.Addr().(*net.TCPAddr).Port
	// Control: the service answers on the address, from roostd's namespace.
	if out, err := exec.Command("nsenter", "--net="+n.daemon, "curl", "-sS", "--noproxy", "*", fmt.Sprintf("http://%s:%d/", added, port)).CombinedOutput(); err != nil || string(out) != "roostd's host\n" {
		t.Fatalf("the host service on %s: %v %s", added, err, out)
	}
	script := fmt.Sprintf(`set +e
for u in http://web.test/hello http://%s:%d/ http://%s:%d/; do
  echo "$u: $(curl -s -o /dev/null -w '%%{http_code} [%%header{x-roost-denied}]' --max-time 20 "$u")"
done`, added, port, daemonAddr, port)
	// daemonAddr is inside the config's permit_cidrs: the operator opened it.
	dir := capsule(t, "hostaddr", script, egressCaps("scoped", "web.test", fmt.Sprintf(`"%s:%d"`, added, port), fmt.Sprintf(`"%s:%d"`, daemonAddr, port)))
	out := d.ctlWithin(2*time.Minute, "run", dir).stdout
	for _, want := range []string{
		"http://web.test/hello: 200 []",
		fmt.Sprintf("http://%s:%d/: 403 [special_address]", added, port),
		fmt.Sprintf("http://%s:%d/: 200 []", daemonAddr, port),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
}
