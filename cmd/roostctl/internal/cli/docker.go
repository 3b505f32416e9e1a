package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// What docker users reach for and roost deliberately lacks, with what to use instead: the
// errors for those flags and commands say it, and so does docs/coming-from-docker.md.

// runFlagHints are for run's and stage's flags (stage is docker create), by how the flag is
// spelt on the line.
var runFlagHints = map[string]string{
	"--rm": "roost keeps every session's record, logs and trace; roostctl rm SESSION or roostctl prune " +
		"removes ended ones, and roostd --retain-ended N / --retain-for DUR does by itself",
	"-e":         envHint,
	"--env":      envHint,
	"--env-file": envHint,
	"-v":         volumeHint,
	"--volume":   volumeHint,
	"--mount":    volumeHint,
	"-w":         "the session's working directory is its workdir: --workdir DIR gives it one of yours",
	"-p":         portHint,
	"--publish":  portHint,
	"-P":         portHint,
	"--network":  networkHint,
	"--net":      networkHint,
	"-i": "run streams output and takes no stdin; roostctl exec -it SESSION -- sh runs a command " +
		"in a running session with a terminal",
	"-t":             "run takes no terminal; roostctl exec -it SESSION -- sh runs a command in a running session with one",
	"--interactive":  "run takes no stdin; roostctl exec -i SESSION -- COMMAND streams stdin to a command in the session",
	"--tty":          "run takes no terminal; roostctl exec -t SESSION -- COMMAND gives one to a command in the session",
	"--privileged":   privilegeHint,
	"--cap-add":      privilegeHint,
	"--security-opt": privilegeHint,
	"--user":         privilegeHint,
	"-u":             privilegeHint,
	"--entrypoint":   "the program is capsule.yaml's run.command (and run.args)",
	"--restart":      "roost restarts no session: an ended one stays ended, with its record; run the capsule again",
	"--cpus":         "capsule.yaml's capabilities.resources.cgroup_cpu_percent (200 is two CPUs) bounds a scoped or sealed session",
}

const (
	rmVolumesHint = "rm always deletes the session's records, home and the workdir roost made; " +
		"one given to roostctl run --workdir is kept"
	envHint = "a session's environment is capsule.yaml's env: (literal values) and capabilities.env.allow " +
		"(host variables roostd's env.passthrough lists too); roostctl exec -e NAME=VALUE sets one for an exec'd command"
	volumeHint = "a session works in its workdir: --workdir DIR gives it one of yours (kept on rm); host trees it " +
		"reads are capsule.yaml's capabilities.filesystem.host_read, among roostd's sessions.host_paths"
	portHint = "sessions publish no ports: a scoped or sealed one's network holds only loopback and its " +
		"endpoint; an advisory or unconfined one shares the host's"
	networkHint = "capsule.yaml's capabilities.network.allow is what a session may reach, through its egress " +
		"proxy in scoped and sealed; its containment class decides the rest"
	privilegeHint = "a session's containment class comes from capsule.yaml (capabilities.containment, a floor; " +
		"--containment raises it) and its grants from capabilities; each session runs as a uid of its own, " +
		"root only for a capsule roostd's sessions.allow_root names; roostctl explain CAPSULE shows what it gets"
)

// flagHints are each command's docker flags, by command name (of roostctl's own commands, not
// those below them: artifacts rm is not rm).
var flagHints = map[string]map[string]string{
	"run":   runFlagHints,
	"stage": runFlagHints,
	"stop": {
		"-t":     "--grace DUR (e.g. --grace 5s) is the time between SIGTERM and SIGKILL",
		"--time": "--grace DUR (e.g. --grace 5s) is the time between SIGTERM and SIGKILL",
	},
	"rm": {
		"-v":        rmVolumesHint,
		"--volumes": rmVolumesHint,
	},
	"logs": {
		"-n": "--tail N",
	},
	"exec": {
		"-u":     "a command runs as the session's own uid, with its containment; there is no other to choose",
		"--user": "a command runs as the session's own uid, with its containment; there is no other to choose",
	},
	"ps": {
		"-n":       "ps lists newest first: roostctl ps -a | head",
		"--last":   "ps lists newest first: roostctl ps -a | head",
		"-l":       "ps lists newest first: roostctl ps -a | head -2",
		"--latest": "ps lists newest first: roostctl ps -a | head -2",
	},
	"stats": {
		"-a":    "stats shows every live session unless given SESSIONs; an ended one has no usage to show",
		"--all": "stats shows every live session unless given SESSIONs; an ended one has no usage to show",
	},
}

// commandHints are docker commands roostctl lacks.
var commandHints = map[string]string{
	"build":   "a capsule is a directory holding capsule.yaml, with nothing to build: roostctl run DIR runs it, roostctl push DIR stores it as name@version",
	"images":  "roostctl artifacts ls lists the pushed capsules",
	"image":   "roostctl artifacts ls lists the pushed capsules; roostctl artifacts rm NAME@VERSION forgets one",
	"rmi":     "roostctl artifacts rm NAME@VERSION",
	"pull":    "capsules come from directories on this host: roostctl push DIR stores one as name@version",
	"attach":  "roostctl logs -f SESSION follows its output; roostctl exec -it SESSION -- sh runs a shell in it",
	"top":     "roostctl stats SESSION shows its processes' count; roostctl exec SESSION -- ps lists them when its shell.allow grants ps",
	"commit":  "a session is not made into a capsule: what it wrote is in its workdir (roostctl inspect -f '{{.workdir}}' SESSION)",
	"create":  "roostctl stage CAPSULE records a session without starting it; roostctl launch SESSION starts it",
	"start":   "roostctl launch SESSION starts a staged session; an ended one does not start again: roostctl run the capsule anew",
	"restart": "an ended session does not start again: roostctl run the capsule anew",
	"unpause": "roostctl resume SESSION",
	"rename":  "a session's name is given when it is made (run or stage --name) and kept until rm",
	"port":    portHint,
	"network": networkHint,
	"volume":  volumeHint,
	"update":  "a session's limits are its capsule.yaml's, fixed at stage; roostctl spend set-limit sets the host's tokens per day",
	"info":    "roostctl doctor says what this host and build can deliver; roostctl version, roostd's version",
}

// flagError is roostctl's error for a flag it could not parse: a usage error, saying what to
// use instead for a docker flag roost lacks.
func flagError(cmd *cobra.Command, err error) error {
	if !cmd.HasParent() {
		// The root parses the flags of a command it does not have (roostctl build -t x .):
		// what it lacks is the command. The words before the flag are its arguments so far.
		if args := cmd.Flags().Args(); len(args) > 0 && commandHints[args[0]] != "" {
			return unknownCommand(cmd, args[0])
		}
	}
	var missing *pflag.NotExistError
	if errors.As(err, &missing) && cmd.HasParent() && !cmd.Parent().HasParent() {
		spelt := "--" + missing.GetSpecifiedName()
		if missing.GetSpecifiedShortnames() != "" {
			spelt = "-" + missing.GetSpecifiedName()
		}
		if hint, ok := flagHints[cmd.Name()][spelt]; ok {
			return usageError{fmt.Errorf("%w\n  docker's %s: %s", err, spelt, hint)}
		}
	}
	return usageError{err}
}

// dockerRunHelp ends roostctl run --help.
const dockerRunHelp = `
Coming from docker (docs/coming-from-docker.md has the rest):
  --rm            sessions are records, kept until roostctl rm or prune (or roostd's
                  --retain-ended N / --retain-for DUR)
  -e K=V          capsule.yaml env: and capabilities.env.allow; exec -e for an exec'd command
  -v a:b          --workdir DIR; capsule.yaml capabilities.filesystem.host_read for host trees
  -p, --network   no ports are published; capsule.yaml capabilities.network.allow
  --privileged    capsule.yaml capabilities.containment, --containment; see roostctl explain
  -it             roostctl exec -it SESSION -- sh, in a running session
`

// addDockerHelp ends run's help with what docker's habits are in roost.
func addDockerHelp(root *cobra.Command) {
	for _, c := range root.Commands() {
		if c.Name() == "run" {
			c.SetHelpTemplate(root.HelpTemplate() + dockerRunHelp)
		}
	}
}

// unknownCommand is the root's error for args[0], which names no command.
func unknownCommand(cmd *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q; see roostctl --help", name)
	if hint := commandHints[name]; hint != "" {
		msg = fmt.Sprintf("unknown command %q\n  docker's %s: %s", name, name, hint)
	} else if s := cmd.SuggestionsFor(name); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
	}
	return usageError{errors.New(msg)}
}
