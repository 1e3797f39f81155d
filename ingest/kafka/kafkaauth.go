package kafka

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/aws"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tidemark-dev/tidemark/config"
)

// AuthError is a Kafka connection refused during TLS or SASL set-up, with
// a reason that says what failed and which setting to check in front of
// the client's error.
type AuthError struct {
	// Reason says what failed, e.g. "SASL authentication failed for user
	// "loader" (SCRAM-SHA-256)".
	Reason string
	// Err is the error of the client or the broker.
	Err error
}

func (e *AuthError) Error() string { return e.Reason + ": " + e.Err.Error() }

// Unwrap returns the client's or the broker's error.
func (e *AuthError) Unwrap() error { return e.Err }

// tokenOutputLimit bounds what token_command may print.
const tokenOutputLimit = 1 << 20

// kafkaAuth builds the TLS and SASL options of the kafka block and turns
// the errors of refused connections into AuthErrors. It remembers the last
// SASL outcome, so that a broker closing the connection during
// authentication (as some brokers and proxies do instead of answering
// with an error) is still reported as an authentication failure.
type kafkaAuth struct {
	k   config.Kafka
	who string // the identity SASL presents, for messages
	log *kafkaLog

	mu       sync.Mutex
	lastFail *AuthError // the last SASL failure
	failedAt time.Time
	okAt     time.Time // the last successful SASL authentication
}

// newKafkaAuth checks the TLS and SASL settings and returns the client
// options that apply them.
func newKafkaAuth(k config.Kafka) (*kafkaAuth, []kgo.Opt, error) {
	a := &kafkaAuth{k: k}
	var opts []kgo.Opt
	if k.TLS.On() {
		tc, err := a.tlsConfig()
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, kgo.Dialer(tlsDialer(tc)))
	}
	if k.SASL != nil {
		m, err := a.mechanism()
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, kgo.SASL(&trackedMechanism{Mechanism: m, a: a}))
	}
	return a, opts, nil
}

func (a *kafkaAuth) tlsConfig() (*tls.Config, error) {
	t := a.k.TLS
	tc := &tls.Config{ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12} //nolint:gosec // opt-in by config
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka.tls.ca_file: no PEM certificates in %s", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		load := func() (*tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("kafka.tls.cert_file: %w", err)
			}
			return &cert, nil
		}
		if _, err := load(); err != nil {
			return nil, err
		}
		// The certificate is sent whenever the broker asks for one, even
		// if it is not signed by one of the authorities the broker names:
		// the broker then says why it refuses it, where Go's default
		// would silently send none. It is read at each handshake, so a
		// renewed certificate is used without a restart.
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, err := load()
			if err != nil {
				return nil, &AuthError{Reason: "TLS handshake failed: cannot load the client certificate", Err: err}
			}
			return cert, nil
		}
	}
	return tc, nil
}

func (a *kafkaAuth) mechanism() (sasl.Mechanism, error) {
	s := a.k.SASL
	switch s.Mechanism {
	case config.MechanismPlain:
		a.who = fmt.Sprintf("for user %q (%s)", s.Username, s.Mechanism)
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			pass, err := a.password()
			return plain.Auth{User: s.Username, Pass: pass}, err
		}), nil
	case config.MechanismScram256, config.MechanismScram512:
		a.who = fmt.Sprintf("for user %q (%s)", s.Username, s.Mechanism)
		fn := func(context.Context) (scram.Auth, error) {
			pass, err := a.password()
			return scram.Auth{User: s.Username, Pass: pass}, err
		}
		if s.Mechanism == config.MechanismScram256 {
			return scram.Sha256(fn), nil
		}
		return scram.Sha512(fn), nil
	case config.MechanismOAuthBearer:
		src := "kafka.sasl.token_file"
		if len(s.TokenCommand) > 0 {
			src = "kafka.sasl.token_command"
		}
		a.who = fmt.Sprintf("with the token from %s (OAUTHBEARER)", src)
		return oauth.Oauth(func(ctx context.Context) (oauth.Auth, error) {
			tok, err := a.token(ctx)
			return oauth.Auth{Token: tok, Extensions: s.Extensions}, err
		}), nil
	case config.MechanismAWSMSKIAM:
		if s.AccessKey == "" {
			for _, env := range []string{config.EnvAWSAccessKeyID, config.EnvAWSSecretAccessKey} {
				if os.Getenv(env) == "" {
					return nil, fmt.Errorf("kafka.sasl.access_key: not set, and %s is not in the environment", env)
				}
			}
			a.who = "with the AWS credentials of the environment (AWS_MSK_IAM)"
		} else {
			a.who = fmt.Sprintf("as AWS access key %s (AWS_MSK_IAM)", s.AccessKey)
		}
		return aws.ManagedStreamingIAM(func(context.Context) (aws.Auth, error) {
			return a.awsAuth()
		}), nil
	}
	return nil, fmt.Errorf("kafka.sasl.mechanism: unsupported %q", s.Mechanism)
}

// password returns the configured password, reading password_file anew.
func (a *kafkaAuth) password() (string, error) {
	s := a.k.SASL
	if s.PasswordFile == "" {
		return s.Password, nil
	}
	p, err := config.ReadSecretFile(s.PasswordFile)
	if err != nil {
		return "", &AuthError{Reason: "SASL: cannot read the password", Err: fmt.Errorf("kafka.sasl.password_file: %w", err)}
	}
	return p, nil
}

// token reads token_file or runs token_command.
func (a *kafkaAuth) token(ctx context.Context) (string, error) {
	s := a.k.SASL
	if s.TokenFile != "" {
		tok, err := config.ReadTokenFile(s.TokenFile)
		if err != nil {
			return "", &AuthError{Reason: "SASL: cannot read the OAUTHBEARER token", Err: fmt.Errorf("kafka.sasl.token_file: %w", err)}
		}
		return tok, nil
	}
	tok, err := runTokenCommand(ctx, s.TokenCommand, s.TokenCommandTimeout.Duration())
	if err != nil {
		return "", &AuthError{Reason: "SASL: cannot get the OAUTHBEARER token", Err: fmt.Errorf("kafka.sasl.token_command: %w", err)}
	}
	return tok, nil
}

// runTokenCommand runs argv without a shell and returns its standard
// output, trimmed; it fails on a non-zero exit, a timeout, or no output.
func runTokenCommand(ctx context.Context, argv []string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...) //nolint:gosec // the command is configuration
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = tokenOutputLimit, 512
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		return "", fmt.Errorf("%s did not finish within %s", argv[0], timeout)
	case err != nil:
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return "", fmt.Errorf("%s: %w: %s", argv[0], err, msg)
		}
		return "", fmt.Errorf("%s: %w", argv[0], err)
	case stdout.over:
		return "", fmt.Errorf("%s printed more than %d bytes", argv[0], tokenOutputLimit)
	}
	tok := strings.TrimSpace(stdout.String())
	if tok == "" {
		return "", fmt.Errorf("%s printed no token", argv[0])
	}
	return tok, nil
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.over = true
		b.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// awsAuth returns the configured AWS credentials or those of the
// environment as they are now.
func (a *kafkaAuth) awsAuth() (aws.Auth, error) {
	s := a.k.SASL
	if s.AccessKey != "" {
		return aws.Auth{AccessKey: s.AccessKey, SecretKey: s.SecretKey, SessionToken: s.SessionToken}, nil
	}
	id, secret := os.Getenv(config.EnvAWSAccessKeyID), os.Getenv(config.EnvAWSSecretAccessKey)
	if id == "" || secret == "" {
		return aws.Auth{}, &AuthError{Reason: "SASL: no AWS credentials",
			Err: fmt.Errorf("kafka.sasl.access_key is not set and %s or %s is empty", config.EnvAWSAccessKeyID, config.EnvAWSSecretAccessKey)}
	}
	return aws.Auth{AccessKey: id, SecretKey: secret, SessionToken: os.Getenv(config.EnvAWSSessionToken)}, nil
}

// trackedMechanism records the outcome of each SASL authentication.
type trackedMechanism struct {
	sasl.Mechanism
	a *kafkaAuth
}

// Authenticate implements sasl.Mechanism.
func (m *trackedMechanism) Authenticate(ctx context.Context, host string) (sasl.Session, []byte, error) {
	s, first, err := m.Mechanism.Authenticate(ctx, host)
	if err != nil {
		return nil, nil, err
	}
	return &trackedSession{Session: s, a: m.a}, first, nil
}

type trackedSession struct {
	sasl.Session
	a *kafkaAuth
}

// Challenge implements sasl.Session.
func (s *trackedSession) Challenge(resp []byte) (bool, []byte, error) {
	done, next, err := s.Session.Challenge(resp)
	if done && err == nil {
		s.a.mu.Lock()
		s.a.okAt = time.Now()
		s.a.mu.Unlock()
	}
	return done, next, err
}

// Connection set-up stages an error can come from.
const (
	stageUnknown = iota // a request's error: only clear TLS and SASL errors count
	stageSASL           // a SASLHandshake or SASLAuthenticate request failed
)

// explain returns err as an AuthError if it is a refusal during TLS or
// SASL set-up, and nil otherwise.
func (a *kafkaAuth) explain(stage int, err error) *AuthError {
	if err == nil {
		return nil
	}
	var ae *AuthError
	if errors.As(err, &ae) {
		return ae
	}
	if r := tlsReason(err, a.k.TLS); r != "" {
		return &AuthError{Reason: r, Err: err}
	}
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.IllegalSaslState):
		return &AuthError{Reason: "SASL authentication failed " + a.who, Err: err}
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return &AuthError{Reason: fmt.Sprintf("SASL mechanism %s is not enabled on the broker", a.mechanismName()), Err: err}
	case stage == stageSASL && a.k.SASL != nil && !routineKafkaError(err):
		return &AuthError{Reason: "SASL authentication failed " + a.who + ": the broker closed the connection", Err: err}
	}
	var eof *kgo.ErrFirstReadEOF
	if errors.As(err, &eof) && a.k.SASL == nil {
		return &AuthError{Reason: "the broker closed the connection at once: does it require SASL (kafka.sasl) or TLS (kafka.tls)?", Err: err}
	}
	return nil
}

func (a *kafkaAuth) mechanismName() string {
	if a.k.SASL == nil {
		return ""
	}
	return a.k.SASL.Mechanism
}

// tlsReason describes a TLS handshake failure, or returns "".
func tlsReason(err error, t *config.TLS) string {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
		header   tls.RecordHeaderError
		op       *net.OpError
	)
	switch {
	case errors.As(err, &unknown):
		return "TLS handshake failed: the broker's certificate is signed by an unknown authority (check kafka.tls.ca_file)"
	case errors.As(err, &hostname):
		return "TLS handshake failed: the broker's certificate does not name the broker (check kafka.tls.server_name)"
	case errors.As(err, &invalid), errors.As(err, &verify):
		return "TLS handshake failed: the broker's certificate is not valid"
	case errors.As(err, &header):
		return "TLS handshake failed: the broker does not speak TLS (check kafka.tls and the broker's listener)"
	case errors.As(err, &op) && op.Op == "remote error":
		msg := op.Err.Error()
		switch {
		case strings.Contains(msg, "certificate required"):
			return "TLS handshake failed: the broker requires a client certificate (kafka.tls.cert_file and kafka.tls.key_file)"
		case strings.Contains(msg, "certificate"), strings.Contains(msg, "unknown ca"), strings.Contains(msg, "access denied"):
			if t != nil && t.CertFile != "" {
				return "TLS handshake failed: the broker refused the client certificate of kafka.tls.cert_file"
			}
			return "TLS handshake failed: the broker refused the connection's certificate"
		}
		return "TLS handshake failed: the broker refused the connection"
	}
	return ""
}

// report records and logs a refused connection; it returns false when err
// is not one, leaving it to the caller.
func (a *kafkaAuth) report(stage int, broker, addr string, err error) bool {
	if a == nil {
		return false
	}
	ae := a.explain(stage, err)
	if ae == nil {
		return false
	}
	if strings.HasPrefix(ae.Reason, "SASL") {
		a.mu.Lock()
		a.lastFail, a.failedAt = ae, time.Now()
		a.mu.Unlock()
	}
	if a.log != nil {
		a.log.emit(slog.LevelError, "auth\x00"+broker+"\x00"+ae.Reason, "Kafka broker refused the connection",
			"broker", broker, "addr", addr, "reason", ae.Reason, "err", ae.Err)
	}
	return true
}

// explainPing turns an error of a request into an AuthError when it is a
// refusal, or when the connection broke after the last SASL attempt
// failed; otherwise it returns err.
func (a *kafkaAuth) explainPing(err error) error {
	if ae := a.explain(stageUnknown, err); ae != nil {
		return ae
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		a.mu.Lock()
		last, failed := a.lastFail, a.failedAt.After(a.okAt)
		a.mu.Unlock()
		if last != nil && failed {
			return last
		}
	}
	return err
}
