package cli

import (
	"strings"
	"testing"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func TestUserNamespaceLines(t *testing.T) {
	u := &roostv1.UserNamespaces{Available: true, Max: 96364, MappingWorks: true,
		IdFirst: 1879048192, IdLast: 2147352575, Ranges: 4094, IdsPerSession: 65536}
	got := userNamespaceLines(u)
	want := [][2]string{
		{"user namespaces", "yes (max 96364); sealed sessions map root to 65536 ids of their own from 1879048192–2147352575 (4094 ranges)"},
		{"apparmor userns", "not restricted (kernel.apparmor_restrict_unprivileged_userns absent; AppArmor not enabled)"},
		{"session ids", "free: no account, group or subordinate id delegation holds one"},
	}
	if len(got) != len(want) {
		t.Fatalf("lines:\n%q", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %q\nwant %q", i, got[i], want[i])
		}
	}

	u = &roostv1.UserNamespaces{Available: true, Max: 10, Detail: "mapping root to host ids 1–65536 in a new user namespace: operation not permitted: lift it",
		ApparmorPresent: true, ApparmorRestricted: true, ApparmorEnabled: true, UnprivilegedClonePresent: true,
		Conflicts: []string{"user carol is delegated subordinate uids 1–10 (/etc/subuid), of which 1–10 are session ids", "group g has gid 5 (/etc/group)"},
		Hint:      "set sessions.ids.first"}
	text := ""
	for _, l := range userNamespaceLines(u) {
		text += l[0] + "|" + l[1] + "\n"
	}
	for _, want := range []string{
		"user namespaces|yes (max 10), but roostd cannot create one mapped to its ids, so sealed sessions cannot run: mapping root to host ids 1–65536",
		"userns clone|kernel.unprivileged_userns_clone = 0: unprivileged users may not create user namespaces; roostd runs as root and is not bound by it",
		"apparmor userns|restricts unprivileged processes (kernel.apparmor_restrict_unprivileged_userns = 1; AppArmor enabled); roostd runs as root and is not restricted",
		"session ids|warn: user carol is delegated subordinate uids 1–10",
		"\n|warn: group g has gid 5 (/etc/group)\n|— set sessions.ids.first\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("lines do not hold %q:\n%s", want, text)
		}
	}
}
