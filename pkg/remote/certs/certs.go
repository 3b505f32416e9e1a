// Package certs makes the certificates of a first remote listener: a CA, a server
// certificate and client certificates it signed (roostctl certs init). It is apart from
// package remote so that roostctl links only crypto for it.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Validity is how long every certificate made here is valid.
const Validity = 365 * 24 * time.Hour

// Client is a client certificate to make: its Common Name, and the file names it goes to.
type Client struct {
	CommonName string
	// Cert and Key are file names in the directory.
	Cert, Key string
}

// Plan is what Init writes.
type Plan struct {
	Dir string
	// ServerNames are the server certificate's DNS names and IP addresses.
	ServerNames []string
	Clients     []Client
}

// The files Init writes besides the clients'.
const (
	CAFile        = "ca.pem"
	CAKeyFile     = "ca-key.pem"
	ServerFile    = "server.pem"
	ServerKeyFile = "server-key.pem"
)

// Init writes a new CA and the certificates of p, each key 0600, into p.Dir (made 0700
// when missing). It refuses to replace any file that is there already.
func Init(p Plan) error {
	if len(p.ServerNames) == 0 {
		return errors.New("the server certificate needs a name or an address")
	}
	files := []string{CAFile, CAKeyFile, ServerFile, ServerKeyFile}
	for _, c := range p.Clients {
		files = append(files, c.Cert, c.Key)
	}
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(p.Dir, f)); err == nil {
			return fmt.Errorf("%s exists: certs init makes a new CA and replaces nothing; give a new directory", filepath.Join(p.Dir, f))
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return err
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "roost CA", Organization: []string{"roost"}},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, ca, err := sign(caTmpl, nil, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := write(p.Dir, CAFile, CAKeyFile, caDER, caKey); err != nil {
		return err
	}
	leaf := func(cn string, usage x509.ExtKeyUsage) *x509.Certificate {
		return &x509.Certificate{
			Subject:     pkix.Name{CommonName: cn},
			NotBefore:   now.Add(-5 * time.Minute),
			NotAfter:    now.Add(Validity),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
	}
	srv := leaf(p.ServerNames[0], x509.ExtKeyUsageServerAuth)
	for _, n := range p.ServerNames {
		if ip := net.ParseIP(n); ip != nil {
			srv.IPAddresses = append(srv.IPAddresses, ip)
		} else {
			srv.DNSNames = append(srv.DNSNames, n)
		}
	}
	if err := issue(p.Dir, ServerFile, ServerKeyFile, srv, ca, caKey); err != nil {
		return err
	}
	for _, c := range p.Clients {
		if err := issue(p.Dir, c.Cert, c.Key, leaf(c.CommonName, x509.ExtKeyUsageClientAuth), ca, caKey); err != nil {
			return err
		}
	}
	return nil
}

func issue(dir, certFile, keyFile string, tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, _, err := sign(tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return write(dir, certFile, keyFile, der, key)
}

// sign signs tmpl with a fresh serial; a nil parent makes it self-signed.
func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) ([]byte, *x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, nil, fmt.Errorf("signing %s: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	return der, cert, err
}

func write(dir, certFile, keyFile string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, keyFile), "PRIVATE KEY", keyDER, 0o600); err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, certFile), "CERTIFICATE", der, 0o644)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
