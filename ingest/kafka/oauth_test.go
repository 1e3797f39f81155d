package kafka_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/oauth"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/testcert"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// oauthBroker teaches a kfake cluster OAUTHBEARER (RFC 7628, KIP-255),
// which kfake does not implement, through its control hooks. The cluster
// runs with SASL enabled, so kfake itself refuses every request of a
// connection that has not authenticated. A SASLHandshake for OAUTHBEARER
// is passed on to kfake as PLAIN; a SASLAuthenticate carrying a token is
// checked against the tokens valid now and, when valid, passed on as the
// PLAIN login of an internal principal, so that kfake completes the
// authentication (and, with connections.max.reauth.ms set, answers with a
// session lifetime and accepts re-authentication, KIP-368). An invalid
// token gets the RFC 7628 error challenge and then
// SASL_AUTHENTICATION_FAILED, as from Kafka.
type oauthBroker struct {
	c *kfake.Cluster

	mu     sync.Mutex
	valid  map[string]bool
	seen   []string // tokens presented, in order
	refuse int      // tokens refused
}

const (
	oauthPrincipal = "oauth-principal"
	oauthSecret    = "internal"
)

// newOAuthCluster starts a cluster with a topic "events" of parts
// partitions whose SASL sessions last lifetime (0: unlimited).
func newOAuthCluster(t *testing.T, parts int32, lifetime time.Duration, valid ...string) *oauthBroker {
	t.Helper()
	opts := []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("PLAIN", oauthPrincipal, oauthSecret)}
	if lifetime > 0 {
		opts = append(opts, kfake.BrokerConfigs(map[string]string{"connections.max.reauth.ms": fmt.Sprint(lifetime.Milliseconds())}))
	}
	o := &oauthBroker{c: kafkatest.NewClusterWith(t, parts, []string{"events"}, opts...), valid: map[string]bool{}}
	for _, v := range valid {
		o.valid[v] = true
	}
	o.c.ControlKey(int16(kmsg.SASLHandshake), func(r kmsg.Request) (kmsg.Response, error, bool) {
		o.c.KeepControl()
		if req := r.(*kmsg.SASLHandshakeRequest); req.Mechanism == "OAUTHBEARER" {
			req.Mechanism = "PLAIN"
		}
		return nil, nil, false
	})
	o.c.ControlKey(int16(kmsg.SASLAuthenticate), func(r kmsg.Request) (kmsg.Response, error, bool) {
		o.c.KeepControl()
		req := r.(*kmsg.SASLAuthenticateRequest)
		resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
		if bytes.Equal(req.SASLAuthBytes, []byte{1}) { // the client's answer to the error challenge
			resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
			msg := `{"status":"invalid_token"}`
			resp.ErrorMessage = &msg
			return resp, nil, true
		}
		token, ok := bearerToken(req.SASLAuthBytes)
		if !ok {
			resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
			return resp, nil, true
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		o.seen = append(o.seen, token)
		if !o.valid[token] {
			o.refuse++
			resp.SASLAuthBytes = []byte(`{"status":"invalid_token"}`)
			return resp, nil, true
		}
		req.SASLAuthBytes = []byte("\x00" + oauthPrincipal + "\x00" + oauthSecret)
		return nil, nil, false
	})
	return o
}

// bearerToken returns the token of an OAUTHBEARER client-first message:
// gs2 header, then \x01-separated key=value pairs, auth=Bearer <token>.
func bearerToken(msg []byte) (string, bool) {
	parts := strings.Split(string(msg), "\x01")
	if len(parts) < 3 || !strings.HasPrefix(parts[0], "n,") {
		return "", false
	}
	for _, kv := range parts[1:] {
		if tok, ok := strings.CutPrefix(kv, "auth=Bearer "); ok {
			return tok, true
		}
	}
	return "", false
}

// setValid replaces the set of valid tokens.
func (o *oauthBroker) setValid(tokens ...string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.valid = map[string]bool{}
	for _, v := range tokens {
		o.valid[v] = true
	}
}

// count returns how often token was presented.
func (o *oauthBroker) count(token string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, s := range o.seen {
		if s == token {
			n++
		}
	}
	return n
}

// producerAuth authenticates the test's producer with its own token.
func producerAuth() kgo.Opt {
	return kgo.SASL(oauth.Auth{Token: "producer-token"}.AsMechanism())
}

// writeAtomically replaces a file the way a token refresher does.
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestOAuthBearer: with mechanism OAUTHBEARER, tidemark loads with the
// token of token_file or of token_command's output; a rotated token file
// is picked up at re-authentication after the old token is revoked; a
// wrong token is refused and named by Ping.
func TestOAuthBearer(t *testing.T) {
	pgtest.ServerIndependent(t)
	t.Run("token_file", func(t *testing.T) {
		o := newOAuthCluster(t, 2, 0, "token-a", "producer-token")
		b := setupWith(t, 2, pgtest.NewDatabase(t), o.c, producerAuth())
		file := filepath.Join(t.TempDir(), "token")
		writeAtomically(t, file, "token-a\n")
		b.kafkaYAML = fmt.Sprintf("  sasl: {mechanism: OAUTHBEARER, token_file: %q, allow_plaintext: true, extensions: {traceid: abc}}", file)
		loadAndCheck(t, b, "oauth", 20)
		if o.count("token-a") == 0 {
			t.Error("the broker never saw token-a")
		}
	})

	t.Run("token_command", func(t *testing.T) {
		o := newOAuthCluster(t, 2, 0, "from-command", "producer-token")
		b := setupWith(t, 2, pgtest.NewDatabase(t), o.c, producerAuth())
		dir := t.TempDir()
		script := filepath.Join(dir, "get-token")
		// Each run appends to runs: the command runs at each authentication.
		body := fmt.Sprintf("#!/bin/sh\necho run >> %q\nprintf '%%s\\n' \"$1\"\n", filepath.Join(dir, "runs"))
		if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
			t.Fatal(err)
		}
		b.kafkaYAML = fmt.Sprintf("  sasl: {mechanism: OAUTHBEARER, token_command: [%q, \"from-command\"], allow_plaintext: true}", script)
		loadAndCheck(t, b, "oauth-cmd", 20)
		runs, err := os.ReadFile(filepath.Join(dir, "runs"))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(runs), "run"); n != o.count("from-command") {
			t.Errorf("command ran %d times for %d authentications", n, o.count("from-command"))
		}
	})

	t.Run("rotation and re-authentication", func(t *testing.T) {
		const lifetime = 3 * time.Second
		o := newOAuthCluster(t, 2, lifetime, "token-a", "producer-token")
		b := setupWith(t, 2, pgtest.NewDatabase(t), o.c, producerAuth())
		file := filepath.Join(t.TempDir(), "token")
		writeAtomically(t, file, "token-a\n")
		b.kafkaYAML = fmt.Sprintf("  sasl: {mechanism: OAUTHBEARER, token_file: %q, allow_plaintext: true}", file)
		var dials atomic.Int64
		r := b.start(t, kgo.WithHooks(dialCounter{&dials}))
		p := &produced{end: map[int32]int64{}}
		b.produce(t, p, eventRecords(b, "before", 10))
		b.waitStored(t, p.end, time.Minute)

		// Rotate, then revoke the old token.
		writeAtomically(t, file, "token-b\n")
		o.setValid("token-b", "producer-token")
		dialsAtRotation := dials.Load()
		// Sessions last 3s: within a few lifetimes every connection has
		// re-authenticated with the new token.
		if err := waitfor.Poll(waitfor.Timeout, func() bool { return o.count("token-b") > int(dials.Load()-dialsAtRotation) }); err != nil {
			t.Fatalf("token-b presented %d times for %d new connections: no re-authentication", o.count("token-b"), dials.Load()-dialsAtRotation)
		}
		b.produce(t, p, eventRecords(b, "after", 10))
		b.waitStored(t, p.end, time.Minute)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.in.Ping(ctx); err != nil {
			t.Errorf("Ping after rotation: %v", err)
		}
		r.stop(t)
		t.Logf("token-a %d, token-b %d authentications; %d new connections after rotation; %d refused",
			o.count("token-a"), o.count("token-b"), dials.Load()-dialsAtRotation, o.refuse)
	})

	t.Run("wrong token", func(t *testing.T) {
		o := newOAuthCluster(t, 1, 0, "producer-token")
		b := setupWith(t, 1, pgtest.NewDatabase(t), o.c, producerAuth())
		produceOne(t, b)
		file := filepath.Join(t.TempDir(), "token")
		writeAtomically(t, file, "stolen\n")
		b.kafkaYAML = fmt.Sprintf("  sasl: {mechanism: OAUTHBEARER, token_file: %q, allow_plaintext: true}", file)
		refused(t, b, `SASL authentication failed with the token from kafka.sasl.token_file (OAUTHBEARER): SASL_AUTHENTICATION_FAILED`, kafka.Options{})
	})

	t.Run("token_command fails", func(t *testing.T) {
		o := newOAuthCluster(t, 1, 0, "producer-token")
		b := setupWith(t, 1, pgtest.NewDatabase(t), o.c, producerAuth())
		produceOne(t, b)
		b.kafkaYAML = "  sasl: {mechanism: OAUTHBEARER, token_command: [sleep, \"10\"], token_command_timeout: 300ms, allow_plaintext: true}"
		refused(t, b, "kafka.sasl.token_command: sleep did not finish within 300ms", kafka.Options{})
	})
}

// dialCounter counts successful broker connections.
type dialCounter struct{ n *atomic.Int64 }

func (d dialCounter) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		d.n.Add(1)
	}
}

// eventRecords returns n valid records with ids prefix-i.
func eventRecords(b *bundle, prefix string, n int) []*kgo.Record {
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		recs = append(recs, &kgo.Record{Topic: b.topic, Partition: int32(i) % b.parts,
			Value: []byte(fmt.Sprintf(`{"event_id":"%s-%d","event_time":"2026-10-05T10:00:00Z"}`, prefix, i))})
	}
	return recs
}

// mskBroker answers AWS_MSK_IAM authentication as MSK does: it checks
// the SigV4 signature of each payload with the secret key it knows for
// the payload's access key id, refuses a wrong one, and keeps each
// payload.
type mskBroker struct {
	c        *kfake.Cluster
	secrets  map[string]string // access key id -> secret key
	mu       sync.Mutex
	payloads []map[string]string
}

// newMSKCluster starts a TLS cluster whose SASL exchange the control
// hooks answer; sessions last lifetime, so that the client
// re-authenticates. kfake's own SASL is off, so requests on a connection
// that skipped SASL are not refused: the test proves what tidemark sends
// and that a wrong signature is refused, not that the broker enforces
// authentication on every connection.
func newMSKCluster(t *testing.T, ca *testcert.CA, lifetime time.Duration, secrets map[string]string) *mskBroker {
	t.Helper()
	m := &mskBroker{c: kafkatest.NewClusterWith(t, 1, []string{"events"}, serverTLS(t, ca, nil)), secrets: secrets}
	m.c.ControlKey(int16(kmsg.SASLHandshake), func(r kmsg.Request) (kmsg.Response, error, bool) {
		m.c.KeepControl()
		req := r.(*kmsg.SASLHandshakeRequest)
		resp := req.ResponseKind().(*kmsg.SASLHandshakeResponse)
		resp.SupportedMechanisms = []string{"AWS_MSK_IAM"}
		if req.Mechanism != "AWS_MSK_IAM" {
			resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
		}
		return resp, nil, true
	})
	m.c.ControlKey(int16(kmsg.SASLAuthenticate), func(r kmsg.Request) (kmsg.Response, error, bool) {
		m.c.KeepControl()
		req := r.(*kmsg.SASLAuthenticateRequest)
		resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
		var p map[string]string
		if err := json.Unmarshal(req.SASLAuthBytes, &p); err != nil {
			resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
			return resp, nil, true
		}
		m.mu.Lock()
		m.payloads = append(m.payloads, p)
		m.mu.Unlock()
		keyID, _, _ := strings.Cut(p["x-amz-credential"], "/")
		secret, known := m.secrets[keyID]
		if !known || p["x-amz-signature"] != sigV4(secret, "eu-west-1", p) {
			resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
			msg := "signature does not match"
			resp.ErrorMessage = &msg
			return resp, nil, true
		}
		resp.SASLAuthBytes = []byte(`{"version":"2020_10_22","request-id":"test"}`)
		resp.SessionLifetimeMillis = lifetime.Milliseconds()
		return resp, nil, true
	})
	return m
}

// sigV4 is the signature AWS Signature Version 4 gives the presigned
// request "GET /?Action=kafka-cluster:Connect&..." that an AWS_MSK_IAM
// payload describes, computed with secret as AWS documents it: a
// canonical request, a string to sign over its hash and the credential
// scope, and a signing key derived from the secret, date, region and
// service.
func sigV4(secret, region string, p map[string]string) string {
	q := url.Values{}
	for param, key := range map[string]string{"Action": "action", "X-Amz-Algorithm": "x-amz-algorithm",
		"X-Amz-Credential": "x-amz-credential", "X-Amz-Date": "x-amz-date", "X-Amz-Expires": "x-amz-expires",
		"X-Amz-SignedHeaders": "x-amz-signedheaders", "X-Amz-Security-Token": "x-amz-security-token"} {
		if v := p[key]; v != "" {
			q.Set(param, v)
		}
	}
	hexSHA := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	mac := func(key []byte, data string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(data))
		return h.Sum(nil)
	}
	canonical := "GET\n/\n" + strings.ReplaceAll(q.Encode(), "+", "%20") + "\nhost:" + p["host"] + "\n\nhost\n" + hexSHA("")
	stamp := p["x-amz-date"]
	if len(stamp) < 8 {
		return ""
	}
	scope := stamp[:8] + "/" + region + "/kafka-cluster/aws4_request"
	toSign := "AWS4-HMAC-SHA256\n" + stamp + "\n" + scope + "\n" + hexSHA(canonical)
	key := mac([]byte("AWS4"+secret), stamp[:8])
	key = mac(key, region)
	key = mac(key, "kafka-cluster")
	key = mac(key, "aws4_request")
	return hex.EncodeToString(mac(key, toSign))
}

func (m *mskBroker) last() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.payloads) == 0 {
		return nil
	}
	return m.payloads[len(m.payloads)-1]
}

// TestAWSMSKIAM: with mechanism AWS_MSK_IAM over TLS, tidemark sends the
// signed payload MSK expects — version 2020_10_22, the broker host, action
// kafka-cluster:Connect, the access key id in x-amz-credential scoped to
// the region and kafka-cluster, a SigV4 signature — with the credentials
// of the keys or, when they are absent, of the environment as it is at
// each authentication; and it loads once the broker accepts.
func TestAWSMSKIAM(t *testing.T) {
	pgtest.ServerIndependent(t)
	t.Setenv("AWS_REGION", "eu-west-1")
	ca := testcert.NewCA(t, "tidemark test CA")
	sigRe := regexp.MustCompile(`^[0-9a-f]{64}$`)
	check := func(t *testing.T, p map[string]string, keyID, token string) {
		t.Helper()
		date := time.Now().UTC().Format("20060102")
		want := map[string]string{
			"version": "2020_10_22", "host": "127.0.0.1", "action": "kafka-cluster:Connect",
			"x-amz-algorithm": "AWS4-HMAC-SHA256", "x-amz-signedheaders": "host", "x-amz-expires": "900",
			"x-amz-credential": keyID + "/" + date + "/eu-west-1/kafka-cluster/aws4_request",
		}
		for k, v := range want {
			if p[k] != v {
				t.Errorf("payload %s = %q, want %q", k, p[k], v)
			}
		}
		if p["x-amz-security-token"] != token {
			t.Errorf("payload x-amz-security-token = %q, want %q", p["x-amz-security-token"], token)
		}
		if !sigRe.MatchString(p["x-amz-signature"]) {
			t.Errorf("payload x-amz-signature = %q, want 64 hex digits", p["x-amz-signature"])
		}
		if !strings.HasPrefix(p["x-amz-date"], date+"T") {
			t.Errorf("payload x-amz-date = %q", p["x-amz-date"])
		}
	}

	t.Run("keys", func(t *testing.T) {
		m := newMSKCluster(t, ca, 0, map[string]string{"AKIAKEYS": "s3cret"})
		b := setupWith(t, 1, pgtest.NewDatabase(t), m.c, kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}))
		b.kafkaYAML = fmt.Sprintf("  tls: {ca_file: %q}\n  sasl: {mechanism: AWS_MSK_IAM, access_key: AKIAKEYS, secret_key: s3cret, session_token: sess-1}", ca.CAFile)
		loadAndCheck(t, b, "msk", 5)
		p := m.last()
		if p == nil {
			t.Fatal("no AWS_MSK_IAM payload reached the broker")
		}
		check(t, p, "AKIAKEYS", "sess-1")
	})

	t.Run("wrong secret key", func(t *testing.T) {
		m := newMSKCluster(t, ca, 0, map[string]string{"AKIAKEYS": "s3cret"})
		b := setupWith(t, 1, pgtest.NewDatabase(t), m.c, kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}))
		produceOne(t, b)
		b.kafkaYAML = fmt.Sprintf("  tls: {ca_file: %q}\n  sasl: {mechanism: AWS_MSK_IAM, access_key: AKIAKEYS, secret_key: guessed}", ca.CAFile)
		refused(t, b, "SASL_AUTHENTICATION_FAILED", kafka.Options{})
		if p := m.last(); p == nil || !strings.HasPrefix(p["x-amz-credential"], "AKIAKEYS/") {
			t.Errorf("the refused payload was %v", p)
		}
	})

	t.Run("environment, read at each authentication", func(t *testing.T) {
		t.Setenv("AWS_ACCESS_KEY_ID", "AKIAFIRST")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "s3cret")
		t.Setenv("AWS_SESSION_TOKEN", "")
		m := newMSKCluster(t, ca, 2*time.Second, map[string]string{"AKIAFIRST": "s3cret", "AKIASECOND": "s3cret"})
		b := setupWith(t, 1, pgtest.NewDatabase(t), m.c, kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}))
		b.kafkaYAML = fmt.Sprintf("  tls: {ca_file: %q}\n  sasl: {mechanism: AWS_MSK_IAM}", ca.CAFile)
		r := b.start(t)
		p := &produced{end: map[int32]int64{}}
		b.produce(t, p, eventRecords(b, "env", 5))
		b.waitStored(t, p.end, time.Minute)
		check(t, m.last(), "AKIAFIRST", "")
		t.Setenv("AWS_ACCESS_KEY_ID", "AKIASECOND")
		t.Setenv("AWS_SESSION_TOKEN", "sess-2")
		if err := waitfor.Poll(waitfor.Timeout, func() bool { return strings.HasPrefix(m.last()["x-amz-credential"], "AKIASECOND/") }); err != nil {
			t.Fatalf("no re-authentication with the new environment; last payload %v", m.last())
		}
		check(t, m.last(), "AKIASECOND", "sess-2")
		r.stop(t)
	})
}
