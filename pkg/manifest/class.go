package manifest

import (
	"fmt"
	"strings"
)

// Class is a containment class. The order of the constants is the order of strength, so
// classes compare with < and combine with max.
type Class int

const (
	// ClassNone is the zero value: no class was named.
	ClassNone Class = iota
	// Unconfined is a plain child process: an operator's explicit choice, never a default.
	Unconfined
	// Advisory records the policy and applies what user space can (environment, rlimits,
	// deadline); the kernel enforces nothing beyond that.
	Advisory
	// Scoped holds the program with Landlock and seccomp on the host's own view.
	Scoped
	// Sealed runs the program in a root composed for it, in its own namespaces and cgroup.
	Sealed
)

// DefaultClass is the floor of a manifest that names none.
const DefaultClass = Advisory

// Classes lists every class, weakest first.
var Classes = []Class{Unconfined, Advisory, Scoped, Sealed}

var classNames = map[Class]string{
	Unconfined: "unconfined",
	Advisory:   "advisory",
	Scoped:     "scoped",
	Sealed:     "sealed",
}

func (c Class) String() string {
	if n, ok := classNames[c]; ok {
		return n
	}
	if c == ClassNone {
		return ""
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// ParseClass reads a class name.
func ParseClass(s string) (Class, error) {
	for c, n := range classNames {
		if n == s {
			return c, nil
		}
	}
	return ClassNone, fmt.Errorf("%q is not a containment class (one of %s)", s, classList())
}

func classList() string {
	names := make([]string, 0, len(Classes))
	for _, c := range Classes {
		names = append(names, c.String())
	}
	return strings.Join(names, ", ")
}
