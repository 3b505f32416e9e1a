package roostinit

import (
	"bufio"
	"debug/elf"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// Landlock is what roost-exec confines with Landlock before it execs the program. Rules are
// built in the program's own view (inside a sealed root, names resolve there).
type Landlock struct {
	// Exec lists what may be executed besides the program itself: names looked up on the
	// program's PATH, or absolute paths. The interpreters they need (the ELF dynamic
	// loader, a script's #! line) are allowed with them. Nothing else may be executed.
	Exec []string `json:"exec"`
	// FS, when set, confines file access too (scoped sessions, on the host's view).
	FS *LandlockFS `json:"fs,omitempty"`
}

// LandlockFS is where a confined program may read and write.
type LandlockFS struct {
	// Read lists trees readable (and listable).
	Read []string `json:"read"`
	// Write lists trees writable: files made, changed and removed, directories too.
	Write []string `json:"write"`
	// WriteFiles lists single files writable (devices such as /dev/null).
	WriteFiles []string `json:"write_files"`
	// ReadFiles lists single files readable.
	ReadFiles []string `json:"read_files,omitempty"`
}

const (
	readRights  = ll.AccessFSReadFile | ll.AccessFSReadDir
	writeRights = readRights | ll.AccessFSWriteFile | ll.AccessFSRemoveDir | ll.AccessFSRemoveFile |
		ll.AccessFSMakeDir | ll.AccessFSMakeReg | ll.AccessFSMakeSym | ll.AccessFSMakeFifo |
		ll.AccessFSMakeSock | ll.AccessFSTruncate | ll.AccessFSRefer
	fileWriteRights = ll.AccessFSReadFile | ll.AccessFSWriteFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev
	allFSRights     = writeRights | ll.AccessFSExecute | ll.AccessFSMakeChar | ll.AccessFSMakeBlock | ll.AccessFSIoctlDev
)

// applyLandlock restricts this process (and what it execs) to the rules. program is the
// resolved path of the program about to be exec'd; it is always executable.
func applyLandlock(l *Landlock, program, path string) error {
	execs := []string{program}
	for _, e := range l.Exec {
		if p, err := lookPath(e, path); err == nil {
			execs = append(execs, p)
		}
	}
	execs = withInterpreters(execs, path)
	rules := []landlock.Rule{landlock.PathAccess(ll.AccessFSExecute, execs...)}
	handled := landlock.AccessFSSet(ll.AccessFSExecute)
	if fs := l.FS; fs != nil {
		handled = allFSRights
		if len(fs.Read) > 0 {
			rules = append(rules, landlock.PathAccess(readRights, fs.Read...).IgnoreIfMissing())
		}
		if len(fs.Write) > 0 {
			rules = append(rules, landlock.PathAccess(writeRights, fs.Write...).IgnoreIfMissing())
		}
		if len(fs.ReadFiles) > 0 {
			rules = append(rules, landlock.PathAccess(ll.AccessFSReadFile, fs.ReadFiles...).IgnoreIfMissing())
		}
		if len(fs.WriteFiles) > 0 {
			rules = append(rules, landlock.PathAccess(fileWriteRights, fs.WriteFiles...).IgnoreIfMissing())
		}
	}
	// Scoped: signals and abstract unix sockets reach only processes in the same Landlock
	// domain, so a program running as root on the host's view cannot signal roostd or any
	// other root process (a same-uid kill needs no capability).
	cfg := landlock.Config{HandledAccessFS: handled, Scoped: ll.ScopeSignal | ll.ScopeAbstractUnixSocket}
	return cfg.BestEffort().Restrict(rules...)
}

// withInterpreters adds what executing each file needs executed with it: the dynamic loader
// an ELF binary names, and the interpreter of a #! script (and its loader).
func withInterpreters(files []string, path string) []string {
	out := slices.Clone(files)
	for i := 0; i < len(out); i++ {
		for _, interp := range interpreters(out[i], path) {
			if !slices.Contains(out, interp) {
				out = append(out, interp)
			}
		}
	}
	return out
}

func interpreters(file, path string) []string {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	head := make([]byte, 2)
	if n, _ := f.Read(head); n == 2 && string(head) == "#!" {
		line, _ := bufio.NewReader(f).ReadString('\n')
		fields := strings.Fields(line)
		if len(fields) == 0 {
			return nil
		}
		out := []string{fields[0]}
		// #!/usr/bin/env python3: env runs the named program from PATH.
		if filepath.Base(fields[0]) == "env" && len(fields) > 1 {
			if p, err := lookPath(fields[1], path); err == nil {
				out = append(out, p)
			}
		}
		return out
	}
	e, err := elf.NewFile(f)
	if err != nil {
		return nil
	}
	defer e.Close()
	for _, prog := range e.Progs {
		if prog.Type == elf.PT_INTERP {
			data := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(data, 0); err == nil {
				return []string{strings.TrimRight(string(data), "\x00")}
			}
		}
	}
	return nil
}
