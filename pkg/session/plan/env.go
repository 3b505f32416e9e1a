package plan

import (
	"slices"
	"strings"

	"roost.dev/roost/pkg/manifest"
)

// What becomes of a host variable a capsule's env.allow names.
const (
	EnvPasses           = "passes"
	EnvNotInPassthrough = "not_in_passthrough"
	EnvCredentialShaped = "credential_shaped"
	EnvCredentialValue  = "credential_value"
	EnvUnset            = "unset"
)

// EnvVerdict is one env.allow entry's fate.
type EnvVerdict struct {
	Name, Verdict, Reason string
}

// HostVariables decides which host variables reach the program: a name must be in the
// capsule's env.allow and in the operator's passthrough list, must not look like a
// credential, and its value must not carry one (a URL with a user in it). It returns what
// passes and, for every env.allow entry, why it does or does not.
func HostVariables(allow, passthrough, host []string) (map[string]string, []EnvVerdict) {
	values := map[string]string{}
	for _, kv := range host {
		if k, v, ok := strings.Cut(kv, "="); ok {
			values[k] = v
		}
	}
	pass := map[string]string{}
	verdicts := make([]EnvVerdict, 0, len(allow))
	for _, name := range allow {
		value, set := values[name]
		var v EnvVerdict
		switch {
		case manifest.CredentialShaped(name):
			v = EnvVerdict{name, EnvCredentialShaped, "its name looks like a credential's; roost never passes one through"}
		case !slices.Contains(passthrough, name):
			v = EnvVerdict{name, EnvNotInPassthrough, "roostd's env.passthrough does not list it: the operator decides what of roostd's environment sessions may see"}
		case !set:
			v = EnvVerdict{name, EnvUnset, "listed by env.passthrough, but roostd's environment does not set it"}
		case manifest.CredentialValue(value):
			v = EnvVerdict{name, EnvCredentialValue, "its value is a URL with a user or password in it; roost never passes a credential through"}
		default:
			v = EnvVerdict{name, EnvPasses, "in env.allow and roostd's env.passthrough, and nothing in it looks like a credential"}
			pass[name] = value
		}
		verdicts = append(verdicts, v)
	}
	return pass, verdicts
}
