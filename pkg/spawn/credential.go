// Package spawn is the rules of delegation: the credentials a session presents to its
// endpoint, the referee that decides whether a session may start a child, and the
// vocabulary the endpoint and the session manager share.
package spawn

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// KeyFile is the MAC key's name in the state directory: persisted, so a restarted daemon
// still honours the credentials of the sessions it re-attaches to.
const KeyFile = "credential.key"

const credentialPrefix = "roost1."

// Keys mints and checks credentials.
type Keys struct {
	key []byte
}

// LoadKeys reads the MAC key at path, creating it (0600, 32 random bytes) when absent.
func LoadKeys(path string) (*Keys, error) {
	key, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := io.ReadFull(rand.Reader, key); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, err
		}
		if _, err := f.Write(key); err != nil {
			f.Close()
			return nil, err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, err
		}
		if err := f.Close(); err != nil {
			return nil, err
		}
		return &Keys{key: key}, nil
	}
	if err != nil {
		return nil, err
	}
	if len(key) < 32 {
		return nil, fmt.Errorf("%s: the credential key is %d bytes; remove the file to make a new one (running sessions' credentials then stop working)", path, len(key))
	}
	return &Keys{key: key}, nil
}

func (k *Keys) mac(sessionID string) []byte {
	m := hmac.New(sha256.New, k.key)
	m.Write([]byte("roost credential\x00"))
	m.Write([]byte(sessionID))
	return m.Sum(nil)
}

// Mint returns the credential naming sessionID.
func (k *Keys) Mint(sessionID string) string {
	enc := base64.RawURLEncoding
	return credentialPrefix + enc.EncodeToString([]byte(sessionID)) + "." + enc.EncodeToString(k.mac(sessionID))
}

// Verify returns the session a credential names, when its MAC is right.
func (k *Keys) Verify(credential string) (string, bool) {
	rest, ok := strings.CutPrefix(credential, credentialPrefix)
	if !ok {
		return "", false
	}
	idPart, _, ok := strings.Cut(rest, ".")
	if !ok {
		return "", false
	}
	id, err := base64.RawURLEncoding.Strict().DecodeString(idPart)
	if err != nil {
		return "", false
	}
	// One spelling per session: the credential must be exactly what Mint gives, so no
	// re-encoding of the same bytes (spare low bits, line breaks) passes too.
	if !hmac.Equal([]byte(credential), []byte(k.Mint(string(id)))) {
		return "", false
	}
	return string(id), true
}
