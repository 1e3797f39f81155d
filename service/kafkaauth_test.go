package service_test

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/testcert"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/service"
)

// TestReadyzNamesKafkaRefusal: /readyz of a running service says why the
// brokers refuse it — a wrong SASL password, a client certificate of the
// wrong authority — and is ready with the right credentials.
func TestReadyzNamesKafkaRefusal(t *testing.T) {
	ca := testcert.NewCA(t, "tidemark test CA")
	other := testcert.NewCA(t, "another CA")
	server := ca.Server(t, "127.0.0.1")
	good, foreign := ca.Client(t, "tidemark"), other.Client(t, "tidemark")
	mtls := kfake.TLS(&tls.Config{Certificates: []tls.Certificate{server.TLS}, MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool})
	scram := []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "loader", "s3cret")}
	tests := []struct {
		name      string
		cluster   []kfake.Opt
		kafkaYAML string
		want      string // in the kafka check of /readyz; "" for ready
	}{
		{"right password", scram,
			"sasl: {mechanism: SCRAM-SHA-256, username: loader, password: s3cret, allow_plaintext: true}", ""},
		{"wrong password", scram,
			"sasl: {mechanism: SCRAM-SHA-256, username: loader, password: wrong, allow_plaintext: true}",
			`SASL authentication failed for user "loader" (SCRAM-SHA-256)`},
		{"client certificate", []kfake.Opt{mtls},
			fmt.Sprintf("tls: {ca_file: %q, cert_file: %q, key_file: %q}", ca.CAFile, good.CertFile, good.KeyFile), ""},
		{"certificate of another CA", []kfake.Opt{mtls},
			fmt.Sprintf("tls: {ca_file: %q, cert_file: %q, key_file: %q}", ca.CAFile, foreign.CertFile, foreign.KeyFile),
			"TLS handshake failed: the broker refused the client certificate of kafka.tls.cert_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := runKafkaOnly(t, kafkatest.NewClusterWith(t, 1, []string{"events"}, tt.cluster...), tt.kafkaYAML)
			var code int
			var checks map[string]string
			if waitfor.Poll(waitfor.Timeout, func() bool {
				code, checks = readyz(t, addr)
				if tt.want == "" {
					return code == http.StatusOK && checks["kafka"] == "ok"
				}
				return code == http.StatusServiceUnavailable && strings.Contains(checks["kafka"], tt.want)
			}) != nil {
				t.Fatalf("/readyz = %d %v, want kafka %q", code, checks, tt.want)
			}
			if tt.want != "" {
				t.Logf("/readyz kafka: %s", checks["kafka"])
			}
		})
	}
}

// runKafkaOnly runs the service with one Kafka source and the given
// kafka keys, and returns its HTTP address.
func runKafkaOnly(t *testing.T, kc *kfake.Cluster, kafkaYAML string) string {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "127.0.0.1:0"}
kafka:
  brokers: [%q]
  group: auth-test
  session_timeout: 1s
  %s
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /id
    event_time: /ts
`, pgtest.NewDatabase(t), kc.ListenAddrs()[0], kafkaYAML)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := runService(t, cfg, service.Options{Now: func() time.Time { return testNow }})
	return addr
}

// readyz returns the status code and the checks of /readyz.
func readyz(t *testing.T, addr string) (int, map[string]string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	checks := map[string]string{}
	if err := json.Unmarshal(body, &checks); err != nil {
		t.Fatalf("/readyz is not JSON: %v\n%s", err, body)
	}
	return resp.StatusCode, checks
}
