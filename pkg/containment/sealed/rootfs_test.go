package sealed

import (
	"strings"
	"testing"
)

func TestPasswdNamesTheShell(t *testing.T) {
	got := passwd("/bin/bash")
	if !strings.HasPrefix(got, "root:x:0:0:root:/root:/bin/bash\n") || !strings.Contains(got, "\nnobody:x:65534:65534:") {
		t.Fatalf("passwd(/bin/bash):\n%s", got)
	}
}

func TestOSRelease(t *testing.T) {
	for _, c := range []struct {
		name, host string
		want       []string
		not        []string
	}{
		{"debian", "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nVERSION=\"12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\nHOME_URL=\"https://www.debian.org/\"\n",
			[]string{"ID=roost", "ID_LIKE=debian", `VERSION_ID=12`, `VERSION="12 (bookworm)"`, "VERSION_CODENAME=bookworm", `PRETTY_NAME="roost sealed session on Debian GNU/Linux 12 (bookworm)"`},
			[]string{"HOME_URL", "ID=debian"}},
		{"ubuntu, like debian", "ID=ubuntu\nID_LIKE=debian\nVERSION_ID=\"24.04\"\n# a comment\n",
			[]string{"ID=roost", `ID_LIKE="ubuntu debian"`, "VERSION_ID=24.04"}, nil},
		{"no host os-release", "", []string{"ID=roost", `PRETTY_NAME="roost sealed session"`}, []string{"ID_LIKE", "VERSION"}},
		{"quotes escaped", "ID=x\nVERSION=\"a \\\"b\\\" $c\"\n", []string{`VERSION="a \"b\" \$c"`}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := osRelease(c.host)
			lines := strings.Split(got, "\n")
			for _, w := range c.want {
				if !containsLine(lines, w) {
					t.Errorf("lacks %q:\n%s", w, got)
				}
			}
			for _, n := range c.not {
				if strings.Contains(got, n) {
					t.Errorf("holds %q:\n%s", n, got)
				}
			}
		})
	}
}

func containsLine(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}
