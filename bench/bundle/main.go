// Command bundle writes an OCI bundle for runc whose root is the one roost composes for a
// sealed session, so that bench/sealed.sh compares runtimes on the same root and limits.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
)

// sessionID names the composed root under <state-dir>/roots; no roostd ever sees it.
const sessionID = "roostbench"

func main() {
	stateDir := flag.String("state-dir", "", "state directory the root is composed under")
	initBin := flag.String("init", "", "roost-init binary (bin/roost-init)")
	capsule := flag.String("capsule", "", "capsule directory holding capsule.yaml")
	workdir := flag.String("workdir", "", "directory mounted at /work")
	out := flag.String("out", "", "bundle directory to write config.json into")
	cgroup := flag.String("cgroups-path", "/roostbench/runc", "linux.cgroupsPath for runc")
	flag.Parse()
	if *stateDir == "" || *initBin == "" || *capsule == "" || *workdir == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: bundle --state-dir DIR --init FILE --capsule DIR --workdir DIR --out DIR")
		os.Exit(2)
	}
	rootfs, err := run(*stateDir, *initBin, *capsule, *workdir, *out, *cgroup)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bundle:", err)
		os.Exit(1)
	}
	fmt.Println(rootfs)
}

func run(stateDir, initBin, capsule, workdir, out, cgroup string) (string, error) {
	// Every path lands in config.json, which runc resolves from the bundle directory.
	for _, p := range []*string{&stateDir, &initBin, &capsule, &workdir, &out} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return "", err
		}
		*p = abs
	}
	file := filepath.Join(capsule, manifest.FileName)
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	m, err := manifest.Parse(data, file)
	if err != nil {
		return "", err
	}
	policy := manifest.Lower(m)
	// runc maps the same ids roost's rehearsals use (the first range of roost's default
	// block), so both pay for the same user namespace.
	ids := containment.IDs{First: config.DefaultFirstID, Size: config.IDsPerSession}
	// As roostd's: the session's root (an unprivileged uid) passes through to its root.
	if err := os.MkdirAll(stateDir, 0o711); err != nil {
		return "", err
	}
	if err := os.Chmod(stateDir, 0o711); err != nil {
		return "", err
	}
	rt, err := sealed.NewRuntime(stateDir, initBin, ids)
	if err != nil {
		return "", err
	}
	if err := os.Chown(workdir, int(ids.First), int(ids.First)); err != nil {
		return "", err
	}
	spec, err := rt.Bundle(sessionID, workdir, capsule, ids, &policy)
	if err != nil {
		return "", err
	}
	// roost-init would start the program through roost-exec; runc starts it directly, so
	// the comparison is the runtime's cost, not roost's supervision.
	spec.Process.Args = []string{"/usr/bin/true"}
	// Each runc run gets a cgroup of its own, apart from roost's /roost/<session>.
	spec.Linux.CgroupsPath = cgroup
	config, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(out, "config.json"), append(config, '\n'), 0o644); err != nil {
		return "", err
	}
	return spec.Root.Path, nil
}
