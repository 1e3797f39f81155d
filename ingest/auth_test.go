package ingest_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tidemark-dev/tidemark/internal/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/pgtest"
)

// testCA is a throwaway certificate authority and a server certificate
// for 127.0.0.1 signed by it.
type testCA struct {
	caFile string
	server tls.Certificate
	pool   *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tidemark test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kafka"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return &testCA{caFile: caFile, pool: pool, server: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
}

// TestTLSAndSASL ingests from a broker that requires TLS and each SASL
// mechanism, configured only through the kafka.tls and kafka.sasl keys.
func TestTLSAndSASL(t *testing.T) {
	ca := newTestCA(t)
	tests := []struct {
		mechanism string
		auth      kgo.Opt
	}{
		{"PLAIN", kgo.SASL(plain.Auth{User: "loader", Pass: "s3cret"}.AsMechanism())},
		{"SCRAM-SHA-256", kgo.SASL(scram.Auth{User: "loader", Pass: "s3cret"}.AsSha256Mechanism())},
		{"SCRAM-SHA-512", kgo.SASL(scram.Auth{User: "loader", Pass: "s3cret"}.AsSha512Mechanism())},
	}
	for _, tt := range tests {
		t.Run(tt.mechanism, func(t *testing.T) {
			c := kafkatest.NewClusterWith(t, 2, []string{"events"},
				kfake.EnableSASL(), kfake.Superuser(tt.mechanism, "loader", "s3cret"),
				kfake.TLS(&tls.Config{Certificates: []tls.Certificate{ca.server}, MinVersion: tls.VersionTLS12}))
			b := setupWith(t, 2, pgtest.NewDatabase(t), c,
				kgo.DialTLSConfig(&tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}), tt.auth)
			b.kafkaYAML = fmt.Sprintf("  tls: {ca_file: %q}\n  sasl: {mechanism: %s, username: loader, password: s3cret}",
				ca.caFile, tt.mechanism)
			want := map[string]bool{}
			var recs []*kgo.Record
			for i := 0; i < 20; i++ {
				id := fmt.Sprintf("%s-%d", tt.mechanism, i)
				want[id] = true
				recs = append(recs, &kgo.Record{Topic: b.topic, Partition: int32(i % 2),
					Value: []byte(fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z"}`, id))})
			}
			p := &produced{end: map[int32]int64{}}
			b.produce(t, p, recs)
			r := b.start(t)
			b.waitStored(t, p.end, time.Minute)
			r.stop(t)
			ingesttest.AssertRaw(t, b.pool, "app_events", want)
		})
	}

	// A wrong password loads nothing and says so through readiness.
	t.Run("wrong password", func(t *testing.T) {
		c := kafkatest.NewClusterWith(t, 1, []string{"events"},
			kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "loader", "s3cret"))
		b := setupWith(t, 1, pgtest.NewDatabase(t), c, kgo.SASL(scram.Auth{User: "loader", Pass: "s3cret"}.AsSha256Mechanism()))
		b.kafkaYAML = "  sasl: {mechanism: SCRAM-SHA-256, username: loader, password: wrong, allow_plaintext: true}"
		r := b.start(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.in.Ping(ctx); err == nil {
			t.Fatal("Ping with a wrong password succeeded")
		}
	})
}
