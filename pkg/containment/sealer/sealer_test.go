package sealer

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"reflect"
	"testing"

	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

func streamPair(t testing.TB) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

// What roostd sends is what libcontainer gets in roost-sealer: every field of a sealed
// configuration crosses the socket (a field lost would be a limit or a mask dropped), and
// the descriptors arrive in order.
func TestRequestCrossesWhole(t *testing.T) {
	spec := specconv.Example()
	spec.Root.Path = t.TempDir()
	limit, pids := int64(64<<20), int64(64)
	spec.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &limit}
	spec.Linux.Resources.Pids = &specs.LinuxPids{Limit: &pids}
	spec.Linux.Seccomp = &specs.LinuxSeccomp{
		DefaultAction: specs.ActErrno,
		Architectures: []specs.Arch{specs.ArchX86_64},
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"read", "write"}, Action: specs.ActAllow},
			{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0x7e020000, Op: specs.OpMaskedEqual}}},
		},
	}
	spec.Linux.MaskedPaths = append(spec.Linux.MaskedPaths, "/proc/kallsyms")
	config, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{CgroupName: "ses_x", NoNewKeyring: true, Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Root: "/var/lib/roost/containers", ID: "ses_x", Config: config, Args: []string{"/.roost/roost-init", "ses_x"}, Env: []string{"PATH=/usr/bin"}, Cwd: "/"}

	var files []*os.File
	for range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		defer r.Close()
		files = append(files, w)
	}
	a, b := streamPair(t)
	errs := make(chan error, 1)
	go func() { errs <- writeMessage(a, req, files) }()
	var got Request
	gotFiles, err := readMessage(b, &got)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	defer closeAll(gotFiles)
	// An empty hooks map comes back nil, which libcontainer reads the same.
	if len(req.Config.Hooks) == 0 && len(got.Config.Hooks) == 0 {
		req.Config.Hooks, got.Config.Hooks = nil, nil
	}
	if !reflect.DeepEqual(got, req) {
		t.Errorf("the request changed crossing the socket:\ngot  %+v\nwant %+v", got.Config, req.Config)
	}
	if len(gotFiles) != len(files) {
		t.Fatalf("%d descriptors arrived, want %d", len(gotFiles), len(files))
	}
	for i, f := range gotFiles {
		var want, have unix.Stat_t
		_ = unix.Fstat(int(files[i].Fd()), &want)
		_ = unix.Fstat(int(f.Fd()), &have)
		if want.Ino != have.Ino {
			t.Errorf("descriptor %d is another file", i)
		}
		flags, _ := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0)
		if flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("descriptor %d arrived without close-on-exec", i)
		}
	}
}

// A message that lies about its size is refused before anything that size is allocated.
func TestOversizeMessageRefused(t *testing.T) {
	a, b := streamPair(t)
	head := make([]byte, 4)
	binary.BigEndian.PutUint32(head, maxMessage+1)
	if _, err := unix.Write(a, head); err != nil {
		t.Fatal(err)
	}
	var v Request
	if _, err := readMessage(b, &v); err == nil || !bytes.Contains([]byte(err.Error()), []byte("over the limit")) {
		t.Fatalf("oversize message: %v", err)
	}
}

func FuzzReadMessage(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Add([]byte{0, 0, 0, 9, '{', '"', 'i', 'd', '"', ':', '1', '}', 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := streamPair(t)
		go func() {
			_, _ = unix.Write(a, data)
			unix.Shutdown(a, unix.SHUT_WR)
		}()
		var v Request
		files, err := readMessage(b, &v)
		closeAll(files)
		if err == nil && len(data) < 4 {
			t.Fatalf("a message of %d bytes was read", len(data))
		}
	})
}

// What roost-sealer logs arrives in roostd's logrus at its level, with its fields; a line at
// panic level does not panic roostd, and a line that is not an entry (a crash's trace) is
// kept as a warning.
func TestRelayLogs(t *testing.T) {
	hook := &captureHook{}
	logger := logrus.StandardLogger()
	oldOut, oldLevel, oldHooks := logger.Out, logger.GetLevel(), logger.ReplaceHooks(logrus.LevelHooks{})
	t.Cleanup(func() { logger.SetOutput(oldOut); logger.SetLevel(oldLevel); logger.ReplaceHooks(oldHooks) })
	logger.SetOutput(io.Discard)
	logger.SetLevel(logrus.DebugLevel)
	logger.AddHook(hook)

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { relayLogs(r); close(done) }()
	_, _ = w.WriteString(`{"level":"debug","msg":"nsexec started","time":"2026-01-01T00:00:00Z","pid":7}` + "\n" +
		`{"level":"panic","msg":"init failed"}` + "\n" +
		"goroutine 1 [running]:\n")
	w.Close()
	<-done

	want := []struct {
		level logrus.Level
		msg   string
	}{{logrus.DebugLevel, "nsexec started"}, {logrus.ErrorLevel, "init failed"}, {logrus.WarnLevel, "goroutine 1 [running]:"}}
	if len(hook.entries) != len(want) {
		t.Fatalf("%d entries relayed, want %d: %+v", len(hook.entries), len(want), hook.entries)
	}
	for i, w := range want {
		if e := hook.entries[i]; e.Level != w.level || e.Message != w.msg {
			t.Errorf("entry %d: %s %q, want %s %q", i, e.Level, e.Message, w.level, w.msg)
		}
	}
	if pid := hook.entries[0].Data["pid"]; pid != float64(7) {
		t.Errorf("the entry's fields were lost: %v", hook.entries[0].Data)
	}
}

type captureHook struct{ entries []logrus.Entry }

func (*captureHook) Levels() []logrus.Level { return logrus.AllLevels }
func (h *captureHook) Fire(e *logrus.Entry) error {
	h.entries = append(h.entries, *e)
	return nil
}
