package cgroups

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ocgroups "github.com/opencontainers/cgroups"
	cgroupsmanager "github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/cgroups/systemd"
	"golang.org/x/sys/unix"
)

// Cgroup drivers: who makes the sessions' cgroups.
const (
	// DriverCgroupfs has roostd make each session's cgroup itself: <parent>/<session>
	// in every mounted hierarchy (the v1 controllers' and the unified one).
	DriverCgroupfs = "cgroupfs"
	// DriverSystemd has systemd make it: a transient scope roost-<session>.scope in the
	// parent slice (roost.slice by default), through libcontainer's systemd cgroup manager.
	DriverSystemd = "systemd"
	// DefaultSystemdSlice is the slice the systemd driver puts sessions' scopes in.
	DefaultSystemdSlice = "roost.slice"
	// SupervisorName is the leaf of its own cgroup roostd runs in when sessions' cgroups
	// go beneath that cgroup: on cgroup v2 only a cgroup without processes of its own hands
	// controllers down ("no internal processes").
	SupervisorName = "supervisor"
	// SessionsName is the cgroup beneath a delegated one that holds sessions' cgroups.
	SessionsName = "sessions"
)

// FallbackParent is where sessions' cgroups go when roostd's own cgroup is not delegated
// to it (see DefaultParent), /roost/<session> in every hierarchy, and where every scoped
// and sealed session's cgroup went before the parent was configurable: Release and Attach
// look there too.
const FallbackParent = "/roost"

// SandboxPrefix begins the id of every sandbox made ahead of its session (the sealed
// runtime's WarmPrefix): a session that claims one keeps the sandbox's cgroup, under the
// sandbox's name, so a session's note may name such a cgroup.
const SandboxPrefix = "warm-"

// CPUPeriod is the CFS period a session's cpu quota is expressed in (100 ms).
const CPUPeriod = 100_000

// Controllers are the controllers scoped and sealed sessions are held by.
func Controllers() []string { return []string{"memory", "pids", "cpu", "freezer"} }

// systemdScopePrefix names sessions' scopes: roost-<session>.scope.
const systemdScopePrefix = "roost"

// Config says where sessions' cgroups go and who makes them. The zero value is the
// default: the cgroupfs driver under DefaultParent.
type Config struct {
	// Parent is, for the cgroupfs driver, an absolute, clean cgroup path (the same in every
	// hierarchy) that must not hold roostd's own cgroup; "" is DefaultParent(). For
	// the systemd driver it is a slice name; "" is DefaultSystemdSlice.
	Parent string
	// Driver is DriverCgroupfs ("" too) or DriverSystemd.
	Driver string
	// StateDir, when set, is where roostd notes each session's cgroup as it makes it
	// (<StateDir>/cgroups/<session>), so that Release, and the sweep after a crash, find it
	// wherever it is, whatever the parent has become since. "" keeps no notes: Release
	// then looks under the configured parent and FallbackParent only.
	StateDir string
}

// Sessions is a resolved Config, shared by the runtimes (containment.WithCgroups): where
// every class's sessions' cgroups go, and where each one went.
type Sessions struct {
	driver string
	// parent is a cgroup path (cgroupfs) or a slice name (systemd).
	parent string
	why    string
	// strict is set when the operator chose the parent or the driver: a session whose cgroup
	// cannot be made does not start. By default an advisory or unconfined session whose
	// cgroup cannot be made for want of permission (a read-only /sys/fs/cgroup) runs
	// without one, as it did before sessions of those classes had one.
	strict bool
	// notes is <StateDir>/cgroups, "" when there are none.
	notes string
	// supervisor is the leaf roostd moved itself into, "" when it did not.
	supervisor string
}

var (
	defaultOnce sync.Once
	defaultCg   *Sessions
)

// Default is the configuration of a runtime given none (containment.WithCgroups): the zero
// Config, resolved once per process, or /roost when even that cannot be had (the reason
// kept in Why).
func Default() *Sessions {
	defaultOnce.Do(func() {
		c, err := New(Config{})
		if err != nil {
			c = &Sessions{driver: DriverCgroupfs, parent: FallbackParent, why: err.Error() + "; using " + FallbackParent}
		}
		defaultCg = c
	})
	return defaultCg
}

// New checks cfg and resolves it. With the systemd driver on a host where systemd
// is not PID 1 it fails, saying so. When the parent lies beneath roostd's own cgroup on a
// cgroup v2 host (the delegated default <own>/sessions, or an operator's parent there),
// New first moves every process of that cgroup, roostd included, into its leaf
// <own>/supervisor, then enables in <own> every controller <own> has: the "no internal
// processes" rule lets only a cgroup without processes hand controllers to its children.
func New(cfg Config) (*Sessions, error) {
	c := &Sessions{driver: cfg.Driver, parent: cfg.Parent}
	switch c.driver {
	case "", DriverCgroupfs:
		c.driver = DriverCgroupfs
		c.strict = cfg.Parent != ""
		if c.parent == "" {
			c.parent, c.why = DefaultParent()
		} else {
			if err := checkCgroupPath(c.parent); err != nil {
				return nil, fmt.Errorf("--cgroup-parent %q: %w", c.parent, err)
			}
			if err := checkOwnOutside(c.parent); err != nil {
				return nil, fmt.Errorf("--cgroup-parent %s: %w", c.parent, err)
			}
			c.why = "--cgroup-parent " + c.parent
		}
	case DriverSystemd:
		c.strict = true
		if c.parent == "" {
			c.parent = DefaultSystemdSlice
		}
		if err := checkSlice(c.parent); err != nil {
			return nil, fmt.Errorf("--cgroup-parent %q for --cgroup-driver systemd: %w", c.parent, err)
		}
		if ok, why := SystemdAvailable(); !ok {
			return nil, fmt.Errorf("--cgroup-driver systemd: %s; use --cgroup-driver cgroupfs", why)
		}
		c.why = fmt.Sprintf("--cgroup-driver systemd: each session a transient scope %s-<session>.scope in %s", systemdScopePrefix, c.parent)
	default:
		return nil, fmt.Errorf("--cgroup-driver %q: not %s or %s", cfg.Driver, DriverCgroupfs, DriverSystemd)
	}
	if c.driver == DriverCgroupfs && ocgroups.IsCgroup2UnifiedMode() {
		own, err := ownUnifiedCgroup()
		if err == nil {
			if root := leafRoot(own, c.parent); root != "" {
				if err := enterLeaf(unifiedMountpoint(), root); err != nil {
					return nil, fmt.Errorf("sessions' cgroups go under %s, beneath roostd's own cgroup %s: moving roostd into its leaf %s: %w", c.parent, root, path.Join(root, SupervisorName), err)
				}
				c.supervisor = path.Join(root, SupervisorName)
				c.why += fmt.Sprintf("; roostd moved itself into %s and enabled %s's controllers for its sessions", c.supervisor, root)
			}
		}
	}
	if cfg.StateDir != "" {
		c.notes = filepath.Join(cfg.StateDir, "cgroups")
		if err := os.MkdirAll(c.notes, 0o700); err != nil {
			return nil, fmt.Errorf("the sessions' cgroup notes: %w", err)
		}
	}
	return c, nil
}

// Driver is DriverCgroupfs or DriverSystemd.
func (c *Sessions) Driver() string { return c.driver }

// Parent is where sessions' cgroups go: a cgroup path (cgroupfs) or a slice (systemd).
func (c *Sessions) Parent() string { return c.parent }

// Why says how the parent was chosen (and what roostd did for it), for its log and doctor.
func (c *Sessions) Why() string { return c.why }

// Supervisor is the leaf of its own cgroup roostd moved itself into; "" when it did not.
func (c *Sessions) Supervisor() string { return c.supervisor }

// Parents lists the cgroups, as /proc/<pid>/cgroup names them, strictly beneath which
// sessions' cgroups are: the parent (a slice's path for systemd), and FallbackParent, where
// sessions started before the parent was configurable still are. A process in a cgroup
// strictly beneath one of them is a session's.
func (c *Sessions) Parents() []string {
	p := c.parent
	if c.driver == DriverSystemd {
		if expanded, err := systemd.ExpandSlice(c.parent); err == nil {
			p = expanded
		}
	}
	if p == FallbackParent {
		return []string{p}
	}
	return []string{p, FallbackParent}
}

// Placement is where sessions' cgroups go, who makes them and why, as doctor tells it.
type Placement struct {
	Driver, Parent, Why string
	// Hint, when set, is what the operator should change for the parent to keep working.
	Hint string
}

// A Reporter is told where sessions' cgroups go (containment.Host is one): this package
// knows nothing of what reports it.
type Reporter interface {
	SetCgroupPlacement(Placement)
}

// Report tells r what roostd uses: a probe of the host only knows the default.
func (c *Sessions) Report(r Reporter) {
	p := Placement{Driver: c.driver, Parent: c.parent, Why: c.why}
	if c.supervisor != "" && ocgroups.IsCgroup2UnifiedMode() {
		if ok, _ := SystemdAvailable(); ok {
			p.Hint = fmt.Sprintf("systemd started roostd in %s itself, which now hands controllers to sessions and so may hold no process: while sessions live, systemd cannot start roostd there again (status 219/CGROUP). Add DelegateSubgroup=%s to roostd's unit (systemd 254 or later), or pass --cgroup-parent %s", path.Dir(c.supervisor), SupervisorName, FallbackParent)
		}
	}
	r.SetCgroupPlacement(p)
}

// Mode is the host's cgroup layout: "v2" (only the unified hierarchy), "hybrid" (v1
// controllers and a unified hierarchy at /sys/fs/cgroup/unified) or "v1".
func Mode() string {
	switch {
	case ocgroups.IsCgroup2UnifiedMode():
		return "v2"
	case ocgroups.IsCgroup2HybridMode():
		return "hybrid"
	}
	return "v1"
}

// unifiedMountpoint is where the unified hierarchy is mounted; "" on a v1 host.
func unifiedMountpoint() string {
	switch Mode() {
	case "v2":
		return "/sys/fs/cgroup"
	case "hybrid":
		return "/sys/fs/cgroup/unified"
	}
	return ""
}

// DefaultParent is where sessions' cgroups go when roostd is given no parent, and
// why: <own>/sessions when roostd's own cgroup (the unified hierarchy's, 0::/… in
// /proc/self/cgroup) is delegated to it, else /roost. A cgroup is delegated when it
// carries systemd's delegation mark (the trusted.delegate or user.delegate xattr, which
// Delegate=yes sets), or, for a roostd that does not run as root, when it is owned by
// roostd's uid with cgroup.procs and cgroup.subtree_control writable. A roostd already in
// the supervisor leaf of a delegated cgroup (DelegateSubgroup=supervisor, or roostd's own
// move) uses that cgroup's sessions. A v1 host has no unified hierarchy to tell: /roost.
func DefaultParent() (parent, why string) {
	mode := Mode()
	if mode == "v1" {
		return defaultParent(mode, "", nil)
	}
	own, err := ownUnifiedCgroup()
	if err != nil {
		return FallbackParent, fmt.Sprintf("reading roostd's own cgroup: %v; sessions' cgroups go to %s", err, FallbackParent)
	}
	mnt := unifiedMountpoint()
	return defaultParent(mode, own, func(cg string) (bool, string) { return delegated(filepath.Join(mnt, cg)) })
}

// defaultParent decides DefaultParent for roostd's own unified cgroup own, asking
// isDelegated about a cgroup path.
func defaultParent(mode, own string, isDelegated func(cg string) (bool, string)) (string, string) {
	every := "at the root of every hierarchy"
	if mode == "hybrid" {
		every = "the same path in every v1 hierarchy and the unified one"
	}
	switch {
	case mode == "v1":
		return FallbackParent, fmt.Sprintf("cgroup v1: no unified hierarchy to find a cgroup delegated to roostd in; sessions' cgroups go to %s, %s", FallbackParent, every)
	case own == "/":
		return FallbackParent, fmt.Sprintf("roostd runs in the unified hierarchy's root cgroup (0::/), which is nobody's to delegate; sessions' cgroups go to %s, %s", FallbackParent, every)
	}
	if ok, how := isDelegated(own); ok && path.Base(own) != SupervisorName {
		// Not by default: to hand its controllers to sessions, roostd would have to leave
		// the cgroup systemd started it in, and while sessions live there systemd could not
		// start roostd in it again (status 219/CGROUP). DelegateSubgroup= starts it in a leaf.
		return FallbackParent, fmt.Sprintf("roostd's cgroup %s is delegated to it (%s), but roostd runs in it rather than in a leaf of it: sessions' cgroups go to %s, %s. Add DelegateSubgroup=%s to roostd's unit (systemd 254 or later) for sessions beneath %s, or pass --cgroup-parent", own, how, FallbackParent, every, SupervisorName, own)
	}
	if path.Base(own) == SupervisorName {
		if up := path.Dir(own); up != "/" {
			if ok, how := isDelegated(up); ok {
				return path.Join(up, SessionsName), fmt.Sprintf("roostd runs in %s, the supervisor leaf of %s, which is delegated to it (%s): sessions' cgroups go beneath %s, %s", own, up, how, up, every)
			}
		}
	}
	return FallbackParent, fmt.Sprintf("roostd's cgroup %s is not delegated to it (no trusted.delegate or user.delegate xattr, as systemd's Delegate=yes sets); sessions' cgroups go to %s, %s", own, FallbackParent, every)
}

// delegated says whether the cgroup directory dir is delegated to this process, and how
// that shows.
func delegated(dir string) (bool, string) {
	for _, attr := range []string{"trusted.delegate", "user.delegate"} {
		buf := make([]byte, 16)
		n, err := unix.Getxattr(dir, attr, buf)
		if err == nil && n > 0 && isTrue(string(buf[:n])) {
			return true, attr + "=" + string(buf[:n])
		}
	}
	// Root owns every cgroup, delegated or not: ownership tells only for another uid.
	if uid := os.Geteuid(); uid != 0 {
		var st unix.Stat_t
		if unix.Stat(dir, &st) == nil && int(st.Uid) == uid &&
			unix.Access(filepath.Join(dir, "cgroup.procs"), unix.W_OK) == nil &&
			unix.Access(filepath.Join(dir, "cgroup.subtree_control"), unix.W_OK) == nil {
			return true, fmt.Sprintf("owned by roostd's uid %d, cgroup.procs and cgroup.subtree_control writable", uid)
		}
	}
	return false, ""
}

func isTrue(v string) bool {
	b, err := strconv.ParseBool(strings.TrimRight(v, "\x00\n"))
	return err == nil && b
}

// SystemdAvailable says whether the systemd cgroup driver can work here: systemd runs as
// PID 1 (/run/systemd/system exists and /proc/1/comm is systemd), and why not.
func SystemdAvailable() (bool, string) {
	if fi, err := os.Lstat("/run/systemd/system"); err != nil || !fi.IsDir() {
		return false, "systemd is not running as PID 1 on this host (no /run/systemd/system)"
	}
	comm, err := os.ReadFile("/proc/1/comm")
	if err != nil {
		return false, fmt.Sprintf("systemd is not running as PID 1 on this host (reading /proc/1/comm: %v)", err)
	}
	if name := strings.TrimSpace(string(comm)); name != "systemd" {
		return false, fmt.Sprintf("systemd is not running as PID 1 on this host (PID 1 is %q)", name)
	}
	return true, "systemd is PID 1 (/run/systemd/system exists)"
}

// ownCgroups are this process's cgroups, by controller ("" is the unified hierarchy's).
func ownCgroups() (map[string]string, error) {
	return ocgroups.ParseCgroupFile("/proc/self/cgroup")
}

// ownUnifiedCgroup is this process's cgroup in the unified hierarchy.
func ownUnifiedCgroup() (string, error) {
	own, err := ownCgroups()
	if err != nil {
		return "", err
	}
	p, ok := own[""]
	if !ok {
		return "", errors.New("/proc/self/cgroup has no unified (0::) entry")
	}
	// Outside its cgroup namespace's root a process's cgroup reads /../…: nothing to use.
	if !path.IsAbs(p) || path.Clean(p) != p || strings.Contains(p, "/..") {
		return "", fmt.Errorf("roostd's unified cgroup %q is outside its cgroup namespace", p)
	}
	return p, nil
}

// checkCgroupPath checks a cgroupfs parent an operator gave: absolute, clean (no "..",
// ".", "//" or trailing "/"), not the root cgroup itself, and printable (a newline would
// split /proc/<pid>/cgroup's lines).
func checkCgroupPath(p string) error {
	switch {
	case p == "":
		return errors.New("empty")
	case !path.IsAbs(p):
		return errors.New("not an absolute cgroup path")
	case slices.Contains(strings.Split(p, "/"), ".."):
		return errors.New(`holds ".."`)
	case path.Clean(p) != p:
		return fmt.Errorf("not clean (%s is)", path.Clean(p))
	case p == "/":
		return errors.New("the root cgroup itself: sessions' cgroups need a parent of their own")
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return errors.New("holds a control character")
		}
	}
	return nil
}

// checkOwnOutside refuses a parent that holds roostd's own cgroup in any hierarchy: a
// process there would count as a session's, and roostd's cgroup would be a session's
// sibling or one itself.
func checkOwnOutside(parent string) error {
	own, err := ownCgroups()
	if err != nil {
		return nil
	}
	for ctrl, p := range own {
		if p == parent || strings.HasPrefix(p, parent+"/") {
			if ctrl == "" {
				ctrl = "unified"
			}
			return fmt.Errorf("holds roostd's own cgroup %s (%s hierarchy); give a parent beside it or beneath it", p, ctrl)
		}
	}
	return nil
}

// checkSlice checks a systemd slice name: name.slice, with "-" nesting slices.
func checkSlice(s string) error {
	if s == "-.slice" {
		return errors.New("the root slice: sessions' scopes need a slice of their own")
	}
	if _, err := systemd.ExpandSlice(s); err != nil {
		return err
	}
	if !unitNameOK(s) {
		return errors.New("a unit name holds only ASCII letters, digits, colons, dashes, underscores and dots")
	}
	return nil
}

func unitNameOK(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(":-_.", r)) {
			return false
		}
	}
	return true
}

// CheckSessionID refuses an id that cannot name a session's cgroup: anything but one path
// element would put the cgroup (and what Release kills) somewhere else.
func CheckSessionID(id string) error {
	if id == "" || id == "." || id == ".." || strings.HasPrefix(id, ".") || strings.ContainsAny(id, "/") || len(id) > 200 {
		return fmt.Errorf("session id %q cannot name a cgroup", id)
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("session id %q cannot name a cgroup", id)
		}
	}
	return nil
}

// leafRoot is the cgroup roostd must leave for its leaf so that parent's cgroups can get
// controllers: its own, when parent lies beneath it; the cgroup its supervisor leaf is in,
// when parent lies beneath that. "" when parent is elsewhere.
func leafRoot(own, parent string) string {
	beneath := func(p, dir string) bool { return dir != "/" && strings.HasPrefix(p, dir+"/") }
	switch {
	case beneath(parent, own):
		return own
	case path.Base(own) == SupervisorName && beneath(parent, path.Dir(own)):
		return path.Dir(own)
	}
	return ""
}

// enterLeaf moves every process of the cgroup root (beneath the cgroup v2 mount mnt) into
// its leaf SupervisorName, then enables in root every controller it has, so that the
// cgroups made beneath it get them.
func enterLeaf(mnt, root string) error {
	dir := filepath.Join(mnt, root)
	leaf := filepath.Join(dir, SupervisorName)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// A child forked while its parent moves may land in root: go round until it is empty.
	empty := false
	for range 20 {
		pids, err := readProcs(dir)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			empty = true
			break
		}
		for _, pid := range pids {
			if err := ocgroups.WriteCgroupProc(leaf, pid); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("moving pid %d: %w", pid, err)
			}
		}
	}
	if !empty {
		return fmt.Errorf("%s still holds processes", dir)
	}
	avail, err := ocgroups.ReadFile(dir, "cgroup.controllers")
	if err != nil {
		return err
	}
	var failed []string
	for _, ctrl := range strings.Fields(avail) {
		if err := ocgroups.WriteFile(dir, "cgroup.subtree_control", "+"+ctrl); err != nil && slices.Contains(Controllers(), ctrl) {
			failed = append(failed, fmt.Sprintf("%s (%v)", ctrl, err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("enabling controllers in %s: %s", dir, strings.Join(failed, ", "))
	}
	return nil
}

func readProcs(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Place is where one session's cgroup is: what the notes keep, and what finds it
// again.
type Place struct {
	Driver string `json:"driver"`
	// Path is the cgroup's path, the same in every hierarchy (cgroupfs), or
	// slice:prefix:session (systemd), as an OCI spec's cgroupsPath says it.
	Path string `json:"path"`
}

// PlaceOf is where a new session's cgroup goes.
func (c *Sessions) PlaceOf(id string) Place {
	if c.driver == DriverSystemd {
		return Place{Driver: DriverSystemd, Path: c.parent + ":" + systemdScopePrefix + ":" + id}
	}
	return Place{Driver: DriverCgroupfs, Path: path.Join(c.parent, id)}
}

// unitName is the systemd scope a place names.
func (p Place) unitName() string {
	parts := strings.Split(p.Path, ":")
	if len(parts) != 3 {
		return ""
	}
	return parts[1] + "-" + parts[2] + ".scope"
}

// Check refuses a place that is not a session id's: a note could otherwise have Release
// kill and remove any cgroup.
func (p Place) Check(id string) error {
	switch p.Driver {
	case DriverCgroupfs:
		if err := checkCgroupPath(p.Path); err != nil {
			return fmt.Errorf("cgroup %q: %w", p.Path, err)
		}
		if !placeNames(path.Base(p.Path), id) || path.Dir(p.Path) == "/" {
			return fmt.Errorf("cgroup %q is not session %s's", p.Path, id)
		}
	case DriverSystemd:
		parts := strings.Split(p.Path, ":")
		if len(parts) != 3 || parts[1] != systemdScopePrefix || !placeNames(parts[2], id) {
			return fmt.Errorf("systemd cgroup %q is not session %s's", p.Path, id)
		}
		if err := checkSlice(parts[0]); err != nil {
			return fmt.Errorf("systemd cgroup %q: %w", p.Path, err)
		}
		if !unitNameOK(p.unitName()) {
			return fmt.Errorf("session id %q cannot name a systemd scope", id)
		}
	default:
		return fmt.Errorf("unknown cgroup driver %q", p.Driver)
	}
	return nil
}

// placeNames says whether a cgroup named name can be session id's: its own, or that of the
// sandbox made ahead that it claimed (the sealed runtime's StartWarm).
func placeNames(name, id string) bool {
	return name == id || strings.HasPrefix(name, SandboxPrefix)
}

// config is libcontainer's description of the place, with res (none: no limits, no device
// rules).
func (p Place) config(res *ocgroups.Resources) *ocgroups.Cgroup {
	if res == nil {
		res = &ocgroups.Resources{SkipDevices: true}
	}
	if p.Driver == DriverSystemd {
		parts := strings.SplitN(p.Path, ":", 3)
		return &ocgroups.Cgroup{Systemd: true, Parent: parts[0], ScopePrefix: parts[1], Name: parts[2], Resources: res}
	}
	return &ocgroups.Cgroup{Path: p.Path, Resources: res}
}

// Manager is a manager of the place's cgroup, with res (none: no limits, no device rules).
func (p Place) Manager(res *ocgroups.Resources) (ocgroups.Manager, error) {
	return cgroupsmanager.New(p.config(res))
}

// exists says whether the place has a directory in any hierarchy.
func (p Place) exists() bool {
	m, err := p.Manager(nil)
	if err != nil {
		return false
	}
	for _, dir := range m.GetPaths() {
		if ocgroups.PathExists(dir) {
			return true
		}
	}
	return false
}

// remove ends everything in the place's cgroup and removes it from every hierarchy.
func (p Place) remove() error {
	m, err := p.Manager(nil)
	if err != nil {
		return err
	}
	var last error
	for range 5 {
		killCgroup(m)
		err := m.Destroy()
		if p.Driver == DriverSystemd && isNoUnit(err) {
			err = nil
		}
		if err == nil {
			return nil
		}
		last = err
	}
	return fmt.Errorf("removing cgroup %s: %w", p.Path, last)
}

// killCgroup SIGKILLs everything in m's cgroup: cgroup.kill where the kernel has it (the
// unified hierarchy, Linux 5.14), then each process, frozen so none forks meanwhile, and
// thawed so the kill lands (a paused session's too).
func killCgroup(m ocgroups.Manager) {
	if u, ok := m.GetPaths()[""]; ok {
		_ = ocgroups.WriteFile(u, "cgroup.kill", "1")
	}
	_ = m.Freeze(ocgroups.Frozen)
	for _, pid := range cgroupPids(m) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = m.Freeze(ocgroups.Thawed)
	// What was killed leaves its cgroups at once, but not before the kill is delivered.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		pids := cgroupPids(m)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// cgroupPids lists the processes in m's cgroup and beneath it, in every hierarchy: a v1
// manager lists only its devices cgroup's, which a session without device rules may lack.
func cgroupPids(m ocgroups.Manager) []int {
	var out []int
	for _, dir := range m.GetPaths() {
		pids, err := ocgroups.GetAllPids(dir)
		if err != nil {
			continue
		}
		for _, pid := range pids {
			if !slices.Contains(out, pid) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// isNoUnit is systemd saying the unit is not there: nothing to stop.
func isNoUnit(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "NoSuchUnit") || strings.Contains(err.Error(), "not loaded"))
}

// Note records a session's place before its cgroup is made.
func (c *Sessions) Note(id string, p Place) error {
	if c.notes == "" {
		return nil
	}
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	tmp := filepath.Join(c.notes, "."+id+".new")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("noting the session's cgroup: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(c.notes, id)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("noting the session's cgroup: %w", err)
	}
	return nil
}

// Move gives the note of from (a sandbox made ahead) to the session to, whose cgroup it is
// now, in one rename: the claim allocates no inode for it, which on a filesystem without a
// journal (ext4 skips every recently deleted inode looking for a free one) costs more than
// the write. Without a note for from, it notes to at from's place.
func (c *Sessions) Move(from, to string) error {
	if c.notes == "" {
		return nil
	}
	err := os.Rename(filepath.Join(c.notes, from), filepath.Join(c.notes, to))
	if errors.Is(err, fs.ErrNotExist) {
		return c.Note(to, c.PlaceOf(from))
	}
	if err != nil {
		return fmt.Errorf("noting the session's cgroup: %w", err)
	}
	return nil
}

// noted is the place noted for a session.
func (c *Sessions) noted(id string) (Place, bool) {
	if c.notes == "" {
		return Place{}, false
	}
	data, err := os.ReadFile(filepath.Join(c.notes, id))
	if err != nil {
		return Place{}, false
	}
	var p Place
	if json.Unmarshal(data, &p) != nil || p.Check(id) != nil {
		return Place{}, false
	}
	return p, true
}

// Forget drops a session's note (its cgroup is gone, or now another's: a claimed sandbox's).
func (c *Sessions) Forget(id string) error {
	if c.notes == "" {
		return nil
	}
	err := os.Remove(filepath.Join(c.notes, id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Held lists the sessions with a noted cgroup: those Release has not removed yet.
func (c *Sessions) Held() ([]string, error) {
	if c.notes == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(c.notes)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.Type().IsRegular() && CheckSessionID(e.Name()) == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// locate lists where a session's cgroup may be: where it was noted, where it would go now,
// and under FallbackParent, where every scoped and sealed session's went before the parent
// was configurable.
func (c *Sessions) locate(id string) []Place {
	var out []Place
	add := func(p Place) {
		if !slices.Contains(out, p) && p.Check(id) == nil {
			out = append(out, p)
		}
	}
	if p, ok := c.noted(id); ok {
		add(p)
	}
	add(c.PlaceOf(id))
	add(Place{Driver: DriverCgroupfs, Path: path.Join(FallbackParent, id)})
	return out
}

// find is the session's existing cgroup; false when it has none anywhere.
func (c *Sessions) find(id string) (Place, bool) {
	if CheckSessionID(id) != nil {
		return Place{}, false
	}
	for _, p := range c.locate(id) {
		if p.exists() {
			return p, true
		}
	}
	return Place{}, false
}

// Remove ends and removes the session's cgroup wherever it is, and its note.
func (c *Sessions) Remove(id string) error {
	if err := CheckSessionID(id); err != nil {
		return err
	}
	var errs []error
	for _, p := range c.locate(id) {
		if err := p.remove(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return c.Forget(id)
}

// Session is a session's cgroup while roostd starts the session into it.
type Session struct {
	place Place
	res   *ocgroups.Resources
	m     ocgroups.Manager
}

// Create makes the session's cgroup, with the limits of res (nil: none), and notes where.
// The systemd driver's scope is made by Join: systemd makes a scope only around a process.
// A session without limits on the default configuration gets nil, and runs without a
// cgroup, when this host does not let roostd make one (EROFS, EACCES, EPERM).
func (c *Sessions) Create(id string, res *ocgroups.Resources) (_ *Session, retErr error) {
	if err := CheckSessionID(id); err != nil {
		return nil, err
	}
	p := c.PlaceOf(id)
	if err := p.Check(id); err != nil {
		return nil, err
	}
	if err := c.Note(id, p); err != nil {
		return nil, err
	}
	s := &Session{place: p, res: res}
	var err error
	if s.m, err = p.Manager(res); err != nil {
		return nil, fmt.Errorf("the session's cgroup %s: %w", p.Path, err)
	}
	if p.Driver == DriverSystemd {
		return s, nil
	}
	defer func() {
		if retErr != nil {
			_ = c.Remove(id)
		}
	}()
	if err := s.m.Apply(-1); err != nil {
		if res == nil && !c.strict && (errors.Is(err, unix.EROFS) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)) {
			_ = c.Remove(id)
			return nil, nil
		}
		return nil, fmt.Errorf("creating the session's cgroup %s: %w", p.Path, err)
	}
	// With no device rules libcontainer leaves the devices hierarchy alone: the session
	// leaves roostd's cgroup there too (a new devices cgroup inherits its parent's rules).
	if dir, ok := s.m.GetPaths()["devices"]; ok && (res == nil || res.SkipDevices) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("creating the session's cgroup %s: %w", dir, err)
		}
	}
	if res != nil {
		if err := s.m.Set(res); err != nil {
			return nil, fmt.Errorf("setting the session's cgroup limits: %w", err)
		}
	}
	return s, nil
}

// IntoFD opens the session's cgroup in the unified hierarchy, for a process to be started
// right into it (CLONE_INTO_CGROUP); nil when it cannot be (systemd, a v1 host).
func (s *Session) IntoFD() *os.File {
	if s == nil || s.place.Driver != DriverCgroupfs {
		return nil
	}
	dir, ok := s.m.GetPaths()[""]
	if !ok {
		return nil
	}
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	return f
}

// Join moves pid (roost-init, before it starts the program) into the session's cgroup in
// every hierarchy; cloned says it was started into the unified one already. The systemd
// driver makes the session's scope around it, then sets its limits.
func (s *Session) Join(pid int, cloned bool) error {
	if s.place.Driver == DriverSystemd {
		if err := s.m.Apply(pid); err != nil {
			return fmt.Errorf("creating the session's scope %s: %w", s.place.unitName(), err)
		}
		if s.res != nil {
			if err := s.m.Set(s.res); err != nil {
				return fmt.Errorf("setting the session's cgroup limits: %w", err)
			}
		}
		return nil
	}
	for name, dir := range s.m.GetPaths() {
		if name == "" && cloned {
			continue
		}
		if !ocgroups.PathExists(dir) {
			continue
		}
		if err := ocgroups.WriteCgroupProc(dir, pid); err != nil {
			return fmt.Errorf("moving roost-init into %s: %w", dir, err)
		}
	}
	return nil
}

// Manager is libcontainer's manager of the cgroup.
func (s *Session) Manager() ocgroups.Manager { return s.m }

// Manager is a manager of the session's existing cgroup, for a re-attached session: nil
// when it has none.
func (c *Sessions) Manager(id string, res *ocgroups.Resources) ocgroups.Manager {
	p, ok := c.find(id)
	if !ok {
		return nil
	}
	m, err := p.Manager(res)
	if err != nil {
		return nil
	}
	return m
}

// OCIPath is a sealed session's cgroupsPath in its OCI spec.
func (c *Sessions) OCIPath(id string) string { return c.PlaceOf(id).Path }
