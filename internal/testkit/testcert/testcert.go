// Package testcert makes throwaway certificate authorities and the server
// and client certificates they sign, as PEM files, for tests of TLS to
// PostgreSQL and to Kafka brokers.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority whose certificate is in CAFile.
type CA struct {
	CAFile string
	Pool   *x509.CertPool

	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial atomic.Int64
}

// Pair is a certificate and its key as PEM files, and as loaded.
type Pair struct {
	CertFile, KeyFile string
	TLS               tls.Certificate
}

// NewCA creates a CA valid for a day, its files in a temporary directory.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("testcert: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("testcert: %v", err)
	}
	ca := &CA{dir: tb.TempDir(), cert: cert, key: key, Pool: x509.NewCertPool()}
	ca.serial.Store(1)
	ca.Pool.AddCert(cert)
	ca.CAFile = filepath.Join(ca.dir, "ca.pem")
	writePEM(tb, ca.CAFile, "CERTIFICATE", der)
	return ca
}

// Server issues a server certificate for hosts (DNS names or IP
// addresses).
func (ca *CA) Server(tb testing.TB, hosts ...string) *Pair {
	tb.Helper()
	tmpl := ca.template(hosts[0], x509.ExtKeyUsageServerAuth)
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(tb, tmpl)
}

// Client issues a client certificate whose common name is user (the name
// PostgreSQL's cert authentication compares with the role).
func (ca *CA) Client(tb testing.TB, user string) *Pair {
	tb.Helper()
	return ca.issue(tb, ca.template(user, x509.ExtKeyUsageClientAuth))
}

func (ca *CA) template(cn string, usage x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{SerialNumber: big.NewInt(ca.serial.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature}
}

func (ca *CA) issue(tb testing.TB, tmpl *x509.Certificate) *Pair {
	tb.Helper()
	key := newKey(tb)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("testcert: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("testcert: %v", err)
	}
	base := filepath.Join(ca.dir, tmpl.SerialNumber.String()+"-"+tmpl.Subject.CommonName)
	p := &Pair{CertFile: base + ".crt", KeyFile: base + ".key",
		TLS: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
	writePEM(tb, p.CertFile, "CERTIFICATE", der)
	writePEM(tb, p.KeyFile, "PRIVATE KEY", keyDER)
	return p
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testcert: %v", err)
	}
	return key
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	// 0600: libpq refuses a client key readable by others.
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("testcert: %v", err)
	}
}
