package remote

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// Setting is one value of the listener's settings and where it came from ("--tls-cert",
// "/etc/roost/roostd.yaml: remote.tls_cert"), for errors that name it.
type Setting struct {
	Value string
	From  string
}

func (s Setting) errorf(format string, args ...any) error {
	return fmt.Errorf("%s %s: %s", s.From, s.Value, fmt.Sprintf(format, args...))
}

// Settings are what the listener needs: where it listens, its certificate and key, the CA
// its clients' certificates must chain to, and the role table.
type Settings struct {
	Listen, Cert, Key, ClientCA Setting
	Roles                       Roles
	// RolesFrom names where the role table came from, for the error of an empty one.
	RolesFrom string
}

// Enabled says whether any setting was given: a listener is wanted.
func (s Settings) Enabled() bool {
	return s.Listen.Value != "" || s.Cert.Value != "" || s.Key.Value != "" || s.ClientCA.Value != ""
}

// TLS checks s and returns the listener's TLS configuration: TLS 1.3 at least, and a
// client certificate required and verified against the client CA. It returns the client
// CA's certificate too, whose subject roostd logs.
func (s Settings) TLS() (*tls.Config, *x509.Certificate, error) {
	if s.Listen.Value == "" {
		for _, set := range []Setting{s.Cert, s.Key, s.ClientCA} {
			if set.Value != "" {
				return nil, nil, fmt.Errorf("%s is set, but not where to listen: set %s", set.From, s.Listen.From)
			}
		}
	}
	for _, need := range []Setting{s.Cert, s.Key, s.ClientCA} {
		if need.Value == "" {
			return nil, nil, fmt.Errorf("%s %s needs %s too: the listener serves only over TLS with client certificates", s.Listen.From, s.Listen.Value, need.From)
		}
	}
	if len(s.Roles) == 0 {
		return nil, nil, fmt.Errorf("%s lists no client, so the listener on %s would refuse every certificate: list each client's common_name and role", s.RolesFrom, s.Listen.Value)
	}
	for _, f := range []Setting{s.Cert, s.Key} {
		if _, err := os.Stat(f.Value); err != nil {
			return nil, nil, f.errorf("%v", pathErr(err))
		}
	}
	if info, err := os.Stat(s.Key.Value); err == nil && info.Mode().Perm()&0o077 != 0 {
		return nil, nil, s.Key.errorf("mode %04o lets others than its owner read the server's private key: chmod 600 it", info.Mode().Perm())
	}
	cert, err := tls.LoadX509KeyPair(s.Cert.Value, s.Key.Value)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s with %s %s: %w", s.Cert.From, s.Cert.Value, s.Key.From, s.Key.Value, err)
	}
	pool, ca, err := LoadCA(s.ClientCA.Value)
	if err != nil {
		return nil, nil, s.ClientCA.errorf("%v", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		NextProtos:   []string{"h2", "http/1.1"},
	}, ca, nil
}

// LoadCA reads a PEM file of CA certificates into a pool; it returns the first too.
func LoadCA(path string) (*x509.CertPool, *x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, pathErr(err)
	}
	pool := x509.NewCertPool()
	var first *x509.Certificate
	for rest := data; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("a certificate in it does not parse: %w", err)
		}
		pool.AddCert(c)
		if first == nil {
			first = c
		}
	}
	if first == nil {
		return nil, nil, errors.New("holds no PEM CERTIFICATE block")
	}
	return pool, first, nil
}

// pathErr is err without the path a PathError repeats: the caller names the file.
func pathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
