package spawn_test

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"roost.dev/roost/pkg/spawn"
)

func loadKeys(t *testing.T, path string) *spawn.Keys {
	t.Helper()
	k, err := spawn.LoadKeys(path)
	if err != nil {
		t.Fatalf("LoadKeys(%s): %v", path, err)
	}
	return k
}

func TestLoadKeysCreatesAndReloads(t *testing.T) {
	path := filepath.Join(t.TempDir(), spawn.KeyFile)
	k := loadKeys(t, path)

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("the key file was not created: %v", err)
	}
	if fi.Mode() != 0o600 {
		t.Fatalf("key file mode %v, want -rw-------", fi.Mode())
	}
	if fi.Size() != 32 {
		t.Fatalf("key file is %d bytes, want 32", fi.Size())
	}
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	cred := k.Mint("sess-1")
	// A restarted daemon must honour what the previous one handed out.
	again := loadKeys(t, path)
	if id, ok := again.Verify(cred); !ok || id != "sess-1" {
		t.Fatalf("a credential minted before the reload: Verify = %q, %v", id, ok)
	}
	if got := again.Mint("sess-1"); got != cred {
		t.Fatalf("the reloaded key mints %q, the first %q", got, cred)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, after) {
		t.Fatal("reloading rewrote the key file")
	}

	// Two fresh key files must not share a key, or the key is not random.
	other := loadKeys(t, filepath.Join(t.TempDir(), spawn.KeyFile))
	if _, ok := other.Verify(cred); ok {
		t.Fatal("a credential verifies under an independently created key")
	}
}

func TestLoadKeysShortFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), spawn.KeyFile)
	if err := os.WriteFile(path, make([]byte, 31), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := spawn.LoadKeys(path)
	if err == nil {
		t.Fatalf("a 31-byte key file was accepted: %v", k)
	}
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("the error does not name the file %s: %v", path, err)
	}
	// The operator's file is left for them to deal with, not silently replaced.
	if data, _ := os.ReadFile(path); len(data) != 31 {
		t.Fatalf("the short key file was changed to %d bytes", len(data))
	}
}

func TestMintVerifyRoundTrip(t *testing.T) {
	k := loadKeys(t, filepath.Join(t.TempDir(), spawn.KeyFile))
	for _, id := range []string{"a", "0123456789abcdef", "with.dots.and/slashes", "ünïcode", strings.Repeat("x", 300), ""} {
		cred := k.Mint(id)
		if !strings.HasPrefix(cred, "roost1.") {
			t.Errorf("Mint(%q) = %q, missing the roost1. prefix", id, cred)
		}
		got, ok := k.Verify(cred)
		if !ok || got != id {
			t.Errorf("Verify(Mint(%q)) = %q, %v", id, got, ok)
		}
	}
}

func TestVerifyRejects(t *testing.T) {
	dir := t.TempDir()
	k := loadKeys(t, filepath.Join(dir, "a.key"))
	other := loadKeys(t, filepath.Join(dir, "b.key"))
	enc := base64.RawURLEncoding

	credA := k.Mint("session-a")
	credB := k.Mint("session-b")
	idA, macA, _ := strings.Cut(strings.TrimPrefix(credA, "roost1."), ".")
	idB, _, _ := strings.Cut(strings.TrimPrefix(credB, "roost1."), ".")

	mac, err := enc.DecodeString(macA)
	if err != nil {
		t.Fatal(err)
	}
	mac[len(mac)/2] ^= 0x01
	tampered := "roost1." + idA + "." + enc.EncodeToString(mac)

	cases := []struct{ name, cred string }{
		{"empty", ""},
		{"prefix only", "roost1."},
		{"wrong prefix", "roost2." + strings.TrimPrefix(credA, "roost1.")},
		{"no prefix", strings.TrimPrefix(credA, "roost1.")},
		{"missing dot", "roost1." + idA + macA},
		{"bad base64 in the id", "roost1." + idA + "!." + macA},
		{"bad base64 in the MAC", "roost1." + idA + "." + macA + "*"},
		{"empty MAC", "roost1." + idA + "."},
		{"MAC of another key", other.Mint("session-a")},
		{"MAC tampered by one byte", tampered},
		{"MAC truncated", "roost1." + idA + "." + macA[:len(macA)-3]},
		{"id of B with the MAC of A", "roost1." + idB + "." + macA},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if id, ok := k.Verify(tc.cred); ok || id != "" {
				t.Fatalf("Verify(%q) = %q, %v; want refusal", tc.cred, id, ok)
			}
		})
	}
}

func FuzzVerify(f *testing.F) {
	k, err := spawn.LoadKeys(filepath.Join(f.TempDir(), spawn.KeyFile))
	if err != nil {
		f.Fatal(err)
	}
	for _, id := range []string{"", "s", "session-a", "with.dot"} {
		f.Add(k.Mint(id))
	}
	f.Add("")
	f.Add("roost1.")
	f.Add("roost1..")
	f.Add("roost1.c2Vzc2lvbg.AAAA")
	// Other spellings of a real credential: spare low bits in the last character, a line
	// break inside (base64 decoders skip both).
	real := k.Mint("session-a")
	f.Add(real[:len(real)-1] + "9")
	f.Add(real[:10] + "\n" + real[10:])
	f.Fuzz(func(t *testing.T, cred string) {
		id, ok := k.Verify(cred)
		if !ok {
			if id != "" {
				t.Fatalf("Verify(%q) refused but returned id %q", cred, id)
			}
			return
		}
		// A credential is one string per session: any other spelling that verifies is
		// a second credential nobody minted.
		if want := k.Mint(id); cred != want {
			t.Fatalf("Verify accepted %q for %q, but Mint gives %q", cred, id, want)
		}
	})
}
