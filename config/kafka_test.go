package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKafkaAuthKeys checks the SASL and TLS keys of each mechanism: the
// valid combinations, and that every problem names its key.
func TestKafkaAuthKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pw, empty, tok := write("pw", "s3cret\n"), write("empty", "\n"), write("token", "eyJ.token\n")
	ca := write("ca.pem", "not checked at load")
	missing := filepath.Join(dir, "missing")
	tlsBlock := "  tls: {ca_file: " + ca + "}"
	doc := func(ls ...string) string {
		return strings.Replace(base(), "kafka:\n", "kafka:\n"+lines(ls...), 1)
	}
	valid := []struct {
		name  string
		data  string
		check func(*SASL) bool
	}{
		{"password_file", doc("  sasl: {mechanism: PLAIN, username: u, password_file: " + pw + ", allow_plaintext: true}"),
			func(s *SASL) bool { return s.PasswordFile == pw }},
		{"token_file", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER, token_file: "+tok+", extensions: {logicalCluster: lkc1}}"),
			func(s *SASL) bool { return s.TokenFile == tok && s.Extensions["logicalCluster"] == "lkc1" }},
		{"token_command", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER, token_command: [cat, "+tok+"], token_command_timeout: 2s}"),
			func(s *SASL) bool {
				return len(s.TokenCommand) == 2 && s.TokenCommandTimeout.Duration() == 2*time.Second
			}},
		{"token_command default timeout", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER, token_command: [cat, "+tok+"]}"),
			func(s *SASL) bool { return s.TokenCommandTimeout.Duration() == 10*time.Second }},
		{"aws keys", doc(tlsBlock, "  sasl: {mechanism: AWS_MSK_IAM, access_key: AKIA1, secret_key: s, session_token: t}"),
			func(s *SASL) bool { return s.AccessKey == "AKIA1" && s.SessionToken == "t" }},
		{"aws environment", doc(tlsBlock, "  sasl: {mechanism: AWS_MSK_IAM}"),
			func(s *SASL) bool { return s.AccessKey == "" }},
	}
	for _, tt := range valid {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, tt.data, nil)
			if !tt.check(cfg.Kafka.SASL) {
				t.Errorf("unexpected sasl %+v", cfg.Kafka.SASL)
			}
		})
	}

	invalid := []struct {
		name string
		data string
		want []wantErr
	}{
		{"password and password_file", doc("  sasl: {mechanism: PLAIN, username: u, password: p, password_file: " + pw + ", allow_plaintext: true}"),
			[]wantErr{{4, "kafka.sasl.password_file", "mutually exclusive"}}},
		{"missing password_file", doc("  sasl: {mechanism: SCRAM-SHA-256, username: u, password_file: " + missing + ", allow_plaintext: true}"),
			[]wantErr{{4, "kafka.sasl.password_file", "cannot read " + missing}}},
		{"empty password_file", doc("  sasl: {mechanism: SCRAM-SHA-256, username: u, password_file: " + empty + ", allow_plaintext: true}"),
			[]wantErr{{4, "kafka.sasl.password_file", "is empty"}}},
		{"oauth without token", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER}"),
			[]wantErr{{5, "kafka.sasl.token_file", "needs token_file or token_command"}}},
		{"oauth with both", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER, token_file: "+tok+", token_command: [cat]}"),
			[]wantErr{{5, "kafka.sasl.token_command", "mutually exclusive"}}},
		{"missing token_file", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER, token_file: "+missing+"}"),
			[]wantErr{{5, "kafka.sasl.token_file", "cannot read"}}},
		{"empty token_file", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER, token_file: "+empty+"}"),
			[]wantErr{{5, "kafka.sasl.token_file", "is empty"}}},
		{"unknown token_command", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER, token_command: [no-such-program-here]}"),
			[]wantErr{{5, "kafka.sasl.token_command[0]", "not found"}}},
		{"short token_command_timeout", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER, token_command: [cat], token_command_timeout: 1ms}"),
			[]wantErr{{5, "kafka.sasl.token_command_timeout", "at least 100ms"}}},
		{"bad extension", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER, token_file: "+tok+", extensions: {auth: x, bad-name: y}}"),
			[]wantErr{{5, "kafka.sasl.extensions.auth", "reserved"}, {5, "kafka.sasl.extensions.bad-name", "letters only"}}},
		{"password with oauth", doc(tlsBlock, "  sasl: {mechanism: OAUTHBEARER, token_file: "+tok+", username: u, password: p}"),
			[]wantErr{{5, "kafka.sasl.password", "is not used by mechanism OAUTHBEARER"}, {5, "kafka.sasl.username", "is not used"}}},
		{"token with scram", doc("  sasl: {mechanism: SCRAM-SHA-512, username: u, password: p, token_file: " + tok + ", allow_plaintext: true}"),
			[]wantErr{{4, "kafka.sasl.token_file", "is not used by mechanism SCRAM-SHA-512 (only by OAUTHBEARER)"}}},
		{"oauth without tls", doc("  sasl: {mechanism: OAUTHBEARER, token_file: " + tok + "}"),
			[]wantErr{{4, "kafka.sasl", "SASL without TLS"}}},
		{"aws without tls", doc("  sasl: {mechanism: AWS_MSK_IAM, allow_plaintext: true}"),
			[]wantErr{{0, "kafka.tls", "AWS_MSK_IAM runs only over TLS"}}},
		{"aws secret without key", doc(tlsBlock, "  sasl: {mechanism: AWS_MSK_IAM, secret_key: s}"),
			[]wantErr{{5, "kafka.sasl.access_key", "is required with secret_key"}}},
		{"aws key without secret", doc(tlsBlock, "  sasl: {mechanism: AWS_MSK_IAM, access_key: a}"),
			[]wantErr{{5, "kafka.sasl.secret_key", "is required with access_key"}}},
		{"aws session token alone", doc(tlsBlock, "  sasl: {mechanism: AWS_MSK_IAM, session_token: t}"),
			[]wantErr{{5, "kafka.sasl.session_token", "needs access_key and secret_key"}}},
	}
	for _, tt := range invalid {
		t.Run(tt.name, func(t *testing.T) {
			errs := parseErrors(t, tt.data, nil)
			if len(errs) != len(tt.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(tt.want), errs)
			}
			for i, w := range tt.want {
				e := errs[i]
				if e.Key != w.key || !strings.Contains(e.Msg, w.msg) || (w.line != 0 && e.Line != w.line) {
					t.Errorf("error %d = %d %s: %s; want %d %s: ...%s...", i, e.Line, e.Key, e.Msg, w.line, w.key, w.msg)
				}
			}
		})
	}
}
