package kafka_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/testcert"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// serverTLS is the kfake TLS option for a broker certificate of ca;
// clients is the pool of the authorities whose client certificates the
// broker requires, or nil when it asks for none.
func serverTLS(t *testing.T, ca *testcert.CA, clients *testcert.CA) kfake.Opt {
	t.Helper()
	tc := &tls.Config{Certificates: []tls.Certificate{ca.Server(t, "127.0.0.1").TLS}, MinVersion: tls.VersionTLS12}
	if clients != nil {
		tc.ClientAuth, tc.ClientCAs = tls.RequireAndVerifyClientCert, clients.Pool
	}
	return kfake.TLS(tc)
}

// loadAndCheck produces n records, runs an ingester with extra client
// options until they are stored, and checks the raw table.
func loadAndCheck(t *testing.T, b *bundle, prefix string, n int, extra ...kgo.Opt) {
	t.Helper()
	want := map[string]bool{}
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		want[id] = true
		recs = append(recs, &kgo.Record{Topic: b.topic, Partition: int32(i) % b.parts,
			Value: []byte(fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z"}`, id))})
	}
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, recs)
	r := b.start(t, extra...)
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	ingesttest.AssertRaw(t, b.pool, "app_events", want)
}

// refused runs an ingester that the broker must refuse and waits until
// both Ping and the log name the reason: Ping returns an *kafka.AuthError
// whose text contains want, and the service log has an error line with
// that reason. It returns the log and the running ingester.
func refused(t *testing.T, b *bundle, want string, opts kafka.Options) (*kafkatest.LogRecorder, *running) {
	t.Helper()
	rec := kafkatest.NewLogRecorder(slog.LevelWarn)
	opts.Logger = slog.New(rec)
	r := b.startWith(t, opts)
	var last error
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		last = r.in.Ping(ctx)
		var ae *kafka.AuthError
		return errors.As(last, &ae) && strings.Contains(last.Error(), want)
	}); err != nil {
		t.Fatalf("Ping did not report %q within %s; last error: %v", want, waitfor.Timeout, last)
	}
	t.Logf("Ping: %v", last)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := rec.Wait(ctx, func(l kafkatest.LogLine) bool {
		return l.Level == slog.LevelError && strings.Contains(l.Attrs["reason"]+": "+l.Attrs["err"], want)
	}); err != nil {
		t.Fatalf("no error line with %q in the log: %v\n%v", want, err, rec.Lines())
	}
	if n := b.storedTotal(t); n != 0 {
		t.Errorf("%d records stored through a refused connection", n)
	}
	return rec, r
}

// TestTLSAndSASL ingests from a broker that requires TLS and each SASL
// mechanism, configured only through the kafka.tls and kafka.sasl keys,
// with the password in the file or in password_file.
func TestTLSAndSASL(t *testing.T) {
	pgtest.ServerIndependent(t)
	ca := testcert.NewCA(t, "tidemark test CA")
	pwFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, mechanism, secret string
		auth                    kgo.Opt
	}{
		{"PLAIN", "PLAIN", "password: s3cret", kgo.SASL(plain.Auth{User: "loader", Pass: "s3cret"}.AsMechanism())},
		{"SCRAM-SHA-256", "SCRAM-SHA-256", "password: s3cret", kgo.SASL(scram.Auth{User: "loader", Pass: "s3cret"}.AsSha256Mechanism())},
		{"SCRAM-SHA-512", "SCRAM-SHA-512", "password: s3cret", kgo.SASL(scram.Auth{User: "loader", Pass: "s3cret"}.AsSha512Mechanism())},
		{"SCRAM-SHA-512 password_file", "SCRAM-SHA-512", fmt.Sprintf("password_file: %q", pwFile),
			kgo.SASL(scram.Auth{User: "loader", Pass: "s3cret"}.AsSha512Mechanism())},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := kafkatest.NewClusterWith(t, 2, []string{"events"},
				kfake.EnableSASL(), kfake.Superuser(tt.mechanism, "loader", "s3cret"), serverTLS(t, ca, nil))
			b := setupWith(t, 2, pgtest.NewDatabase(t), c,
				kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}), tt.auth)
			b.kafkaYAML = fmt.Sprintf("  tls: {ca_file: %q}\n  sasl: {mechanism: %s, username: loader, %s}",
				ca.CAFile, tt.mechanism, tt.secret)
			loadAndCheck(t, b, tt.name, 20)
		})
	}
}

// TestMutualTLS: a broker that requires client certificates accepts the
// one of kafka.tls.cert_file and key_file and refuses a connection
// without a certificate, with a certificate of another authority, and a
// client that does not trust the broker's authority; each refusal is
// named by Ping and logged at error level.
func TestMutualTLS(t *testing.T) {
	pgtest.ServerIndependent(t)
	ca := testcert.NewCA(t, "tidemark test CA")
	other := testcert.NewCA(t, "another CA")
	good, foreign := ca.Client(t, "tidemark"), other.Client(t, "tidemark")
	tests := []struct {
		name   string
		caFile string
		client *testcert.Pair
		want   string // "" for success
	}{
		{"client certificate", ca.CAFile, good, ""},
		{"no client certificate", ca.CAFile, nil, "the broker requires a client certificate"},
		{"certificate of another CA", ca.CAFile, foreign, "the broker refused the client certificate of kafka.tls.cert_file"},
		{"broker of an untrusted CA", other.CAFile, good, "the broker's certificate is signed by an unknown authority (check kafka.tls.ca_file)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := kafkatest.NewClusterWith(t, 2, []string{"events"}, serverTLS(t, ca, ca))
			b := setupWith(t, 2, pgtest.NewDatabase(t), c, kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool,
				Certificates: []tls.Certificate{good.TLS}, MinVersion: tls.VersionTLS12}))
			b.kafkaYAML = fmt.Sprintf("  tls: {ca_file: %q}", tt.caFile)
			if tt.client != nil {
				b.kafkaYAML = fmt.Sprintf("  tls: {ca_file: %q, cert_file: %q, key_file: %q}", tt.caFile, tt.client.CertFile, tt.client.KeyFile)
			}
			if tt.want == "" {
				loadAndCheck(t, b, "mtls", 20)
				return
			}
			produceOne(t, b)
			refused(t, b, tt.want, kafka.Options{})
		})
	}
}

// produceOne writes one record, so that a refused ingester has something
// it must not load.
func produceOne(t *testing.T, b *bundle) {
	t.Helper()
	b.produce(t, &produced{end: map[int32]int64{}}, []*kgo.Record{{Topic: b.topic, Partition: 0,
		Value: []byte(`{"event_id":"one","event_time":"2026-10-05T10:00:00Z"}`)}})
}

// countSASL counts the SASLAuthenticate requests of a cluster without
// handling them.
func countSASL(c *kfake.Cluster) *atomic.Int64 {
	var n atomic.Int64
	c.ControlKey(int16(kmsg.SASLAuthenticate), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		n.Add(1)
		return nil, nil, false
	})
	return &n
}

// TestSASLWrongCredentials: a wrong password or user is refused for PLAIN
// and SCRAM, whether the broker answers SASL_AUTHENTICATION_FAILED (as
// Kafka does) or closes the connection (as kfake does). The client keeps
// retrying, Ping names the user, and the log has one error line per
// broker and interval, not one per attempt.
func TestSASLWrongCredentials(t *testing.T) {
	pgtest.ServerIndependent(t)
	tests := []struct {
		name, mechanism, user, pass string
		kafkaAnswer                 bool // answer SASL_AUTHENTICATION_FAILED instead of closing
	}{
		{"PLAIN wrong password", "PLAIN", "loader", "wrong", false},
		{"PLAIN wrong password, broker answers", "PLAIN", "loader", "wrong", true},
		{"SCRAM-SHA-256 wrong password", "SCRAM-SHA-256", "loader", "wrong", false},
		{"SCRAM-SHA-512 unknown user", "SCRAM-SHA-512", "intruder", "s3cret", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := kafkatest.NewClusterWith(t, 1, []string{"events"}, kfake.EnableSASL(), kfake.Superuser(tt.mechanism, "loader", "s3cret"))
			var producerAuth kgo.Opt
			switch tt.mechanism {
			case "PLAIN":
				producerAuth = kgo.SASL(plain.Auth{User: "loader", Pass: "s3cret"}.AsMechanism())
			case "SCRAM-SHA-256":
				producerAuth = kgo.SASL(scram.Auth{User: "loader", Pass: "s3cret"}.AsSha256Mechanism())
			default:
				producerAuth = kgo.SASL(scram.Auth{User: "loader", Pass: "s3cret"}.AsSha512Mechanism())
			}
			b := setupWith(t, 1, pgtest.NewDatabase(t), c, producerAuth)
			produceOne(t, b)
			attempts := countSASL(c) // first: it only counts
			if tt.kafkaAnswer {
				c.ControlKey(int16(kmsg.SASLAuthenticate), func(r kmsg.Request) (kmsg.Response, error, bool) {
					c.KeepControl()
					req := r.(*kmsg.SASLAuthenticateRequest)
					if strings.HasSuffix(string(req.SASLAuthBytes), "\x00s3cret") {
						return nil, nil, false
					}
					resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
					resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
					msg := "Authentication failed: Invalid username or password"
					resp.ErrorMessage = &msg
					return resp, nil, true
				})
			}
			b.kafkaYAML = fmt.Sprintf("  sasl: {mechanism: %s, username: %s, password: %s, allow_plaintext: true}", tt.mechanism, tt.user, tt.pass)
			want := fmt.Sprintf("SASL authentication failed for user %q (%s)", tt.user, tt.mechanism)
			rec, _ := refused(t, b, want, kafka.Options{})
			// Let the client retry a few times: the log must not grow with it.
			before := attempts.Load()
			if err := waitfor.Poll(waitfor.Timeout, func() bool { return attempts.Load() >= before+3 }); err != nil {
				t.Fatalf("the client stopped retrying after %d attempts", attempts.Load())
			}
			var lines int
			for _, l := range rec.Lines() {
				if l.Level == slog.LevelError && strings.Contains(l.Attrs["reason"], "SASL authentication failed") {
					lines++
				}
			}
			if lines != 1 {
				t.Errorf("%d error lines about the refusal for %d attempts, want 1:\n%v", lines, attempts.Load(), rec.Lines())
			}
			t.Logf("%d attempts, %d error line(s)", attempts.Load(), lines)
		})
	}
}
