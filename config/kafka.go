package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"sort"
	"strings"
)

// Kafka is the connection to the brokers shared by all Kafka sources.
type Kafka struct {
	Brokers          []string `yaml:"brokers"`
	Group            string   `yaml:"group"` // consumer group
	ClientID         string   `yaml:"client_id"`
	StartOffset      string   `yaml:"start_offset"`
	SessionTimeout   Duration `yaml:"session_timeout"`
	RebalanceTimeout Duration `yaml:"rebalance_timeout"`
	FetchMaxBytes    ByteSize `yaml:"fetch_max_bytes"`
	// FetchMaxPartitionBytes is the most one partition contributes to a
	// fetch (Kafka's max.partition.fetch.bytes).
	FetchMaxPartitionBytes ByteSize `yaml:"fetch_max_partition_bytes"`
	TLS                    *TLS     `yaml:"tls"`
	SASL                   *SASL    `yaml:"sasl"`
}

// TLS configures encrypted connections to the brokers.
type TLS struct {
	Enabled            bool   `yaml:"enabled"` // false turns the block off
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// On reports whether TLS is used.
func (t *TLS) On() bool { return t != nil && t.Enabled }

// SASL mechanisms.
const (
	MechanismPlain       = "PLAIN"
	MechanismScram256    = "SCRAM-SHA-256"
	MechanismScram512    = "SCRAM-SHA-512"
	MechanismOAuthBearer = "OAUTHBEARER"
	MechanismAWSMSKIAM   = "AWS_MSK_IAM"
)

// The environment variables AWS_MSK_IAM reads when the keys are not set.
const (
	EnvAWSAccessKeyID     = "AWS_ACCESS_KEY_ID"
	EnvAWSSecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	EnvAWSSessionToken    = "AWS_SESSION_TOKEN"
)

// SASL configures broker authentication. Which keys apply depends on the
// mechanism: username with password or password_file for PLAIN and
// SCRAM; token_file or token_command for OAUTHBEARER; access_key,
// secret_key and session_token (or the AWS environment variables) for
// AWS_MSK_IAM.
type SASL struct {
	Mechanism string `yaml:"mechanism"`
	Username  string `yaml:"username"`
	Password  string `yaml:"password"`
	// PasswordFile holds the password instead of Password; it is read at
	// each authentication, one trailing newline removed.
	PasswordFile string `yaml:"password_file"`

	// TokenFile holds the OAUTHBEARER token; it is read at each
	// authentication, so a rotated file is picked up.
	TokenFile string `yaml:"token_file"`
	// TokenCommand is run (without a shell) at each authentication; its
	// standard output is the OAUTHBEARER token.
	TokenCommand []string `yaml:"token_command"`
	// TokenCommandTimeout bounds one run of TokenCommand.
	TokenCommandTimeout Duration `yaml:"token_command_timeout"`
	// Extensions are OAUTHBEARER SASL extensions (KIP-342).
	Extensions map[string]string `yaml:"extensions"`

	// AccessKey, SecretKey and SessionToken are AWS credentials for
	// AWS_MSK_IAM; when AccessKey is empty, the standard AWS environment
	// variables are read at each authentication.
	AccessKey    string `yaml:"access_key"`
	SecretKey    string `yaml:"secret_key"`
	SessionToken string `yaml:"session_token"`

	// AllowPlaintext accepts SASL on connections without TLS (Kafka's
	// SASL_PLAINTEXT), where the credentials can be read or attacked on
	// the network. AWS_MSK_IAM always needs TLS.
	AllowPlaintext bool `yaml:"allow_plaintext"`
}

// ReadTokenFile reads a file holding a bearer token, surrounding white
// space removed. It fails when the file cannot be read or holds nothing.
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("cannot read %s: %w", path, errors.Unwrap(err))
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

func (c *Config) validateKafka(ix *index) {
	k := c.Kafka
	if len(k.Brokers) == 0 {
		ix.add("kafka.brokers", "at least one broker is required by the Kafka sources")
	}
	for i, b := range k.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			ix.add(fmt.Sprintf("kafka.brokers[%d]", i), "must be host:port, got %q", b)
		}
	}
	for _, key := range []string{"start_offset", "session_timeout", "rebalance_timeout"} {
		c.check(ix, "kafka."+key, "")
	}
	// The partition's bound is the whole fetch's.
	if c.check(ix, "kafka.fetch_max_bytes", "") {
		c.check(ix, "kafka.fetch_max_partition_bytes", "")
	}
	// A fetch and two batches (one written, the next decoded meanwhile)
	// are what the ingester holds at most.
	in := c.Ingest
	if need := k.FetchMaxBytes + 2*in.BatchMaxBytes; in.MemoryMaxBytes > 0 && need > in.MemoryMaxBytes {
		ix.add("ingest.memory_max_bytes", "must hold kafka.fetch_max_bytes (%s) and twice ingest.batch_max_bytes (%s): at least %s, got %s; "+
			"raise it, or leave those two out to take a third of it each",
			formatValue(reflect.ValueOf(k.FetchMaxBytes)), formatValue(reflect.ValueOf(in.BatchMaxBytes)),
			formatValue(reflect.ValueOf(need)), formatValue(reflect.ValueOf(in.MemoryMaxBytes)))
	}
	if t := k.TLS; t.On() {
		for key, f := range map[string]string{"ca_file": t.CAFile, "cert_file": t.CertFile, "key_file": t.KeyFile} {
			if f == "" {
				continue
			}
			if _, err := os.Stat(f); err != nil {
				ix.add("kafka.tls."+key, "cannot read %s: %v", f, errors.Unwrap(err))
			}
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			ix.add("kafka.tls.cert_file", "cert_file and key_file must be given together")
		}
	}
	if s := k.SASL; s != nil {
		c.validateSASL(ix, s, k.TLS.On())
	}
}

// saslKeys are the mechanism-specific keys of the sasl block, with the
// mechanisms that use them.
var saslKeys = []struct {
	key        string
	set        func(*SASL) bool
	mechanisms []string
}{
	{"username", func(s *SASL) bool { return s.Username != "" }, []string{MechanismPlain, MechanismScram256, MechanismScram512}},
	{"password", func(s *SASL) bool { return s.Password != "" }, []string{MechanismPlain, MechanismScram256, MechanismScram512}},
	{"password_file", func(s *SASL) bool { return s.PasswordFile != "" }, []string{MechanismPlain, MechanismScram256, MechanismScram512}},
	{"token_file", func(s *SASL) bool { return s.TokenFile != "" }, []string{MechanismOAuthBearer}},
	{"token_command", func(s *SASL) bool { return len(s.TokenCommand) > 0 }, []string{MechanismOAuthBearer}},
	{"token_command_timeout", func(s *SASL) bool { return s.TokenCommandTimeout != 0 }, []string{MechanismOAuthBearer}},
	{"extensions", func(s *SASL) bool { return len(s.Extensions) > 0 }, []string{MechanismOAuthBearer}},
	{"access_key", func(s *SASL) bool { return s.AccessKey != "" }, []string{MechanismAWSMSKIAM}},
	{"secret_key", func(s *SASL) bool { return s.SecretKey != "" }, []string{MechanismAWSMSKIAM}},
	{"session_token", func(s *SASL) bool { return s.SessionToken != "" }, []string{MechanismAWSMSKIAM}},
}

// extensionKeyRe is the key syntax of RFC 7628 section 3.1.
var extensionKeyRe = regexp.MustCompile(`^[A-Za-z]+$`)

func (c *Config) validateSASL(ix *index, s *SASL, tlsOn bool) {
	known := keyOf("kafka.sasl.mechanism").OneOf
	c.check(ix, "kafka.sasl.mechanism", "")
	for _, k := range saslKeys {
		if !k.set(s) {
			continue
		}
		used := false
		for _, m := range k.mechanisms {
			used = used || m == s.Mechanism
		}
		// An unknown mechanism is reported once, above.
		if !used && contains(known, s.Mechanism) {
			ix.add("kafka.sasl."+k.key, "is not used by mechanism %s (only by %s)", s.Mechanism, strings.Join(k.mechanisms, ", "))
		}
	}
	switch s.Mechanism {
	case MechanismOAuthBearer:
		c.validateOAuth(ix, s)
	case MechanismAWSMSKIAM:
		if s.AccessKey == "" && s.SecretKey != "" {
			ix.add("kafka.sasl.access_key", "is required with secret_key")
		}
		if s.AccessKey != "" && s.SecretKey == "" {
			ix.add("kafka.sasl.secret_key", "is required with access_key")
		}
		if s.AccessKey == "" && s.SessionToken != "" {
			ix.add("kafka.sasl.session_token", "needs access_key and secret_key")
		}
		if !tlsOn {
			ix.add("kafka.tls", "AWS_MSK_IAM runs only over TLS: add a tls block (allow_plaintext does not apply)")
			return
		}
	default:
		if s.Username == "" {
			ix.add("kafka.sasl.username", "is required with SASL")
		}
		switch {
		case s.Password != "" && s.PasswordFile != "":
			ix.add("kafka.sasl.password_file", "password and password_file are mutually exclusive")
		case s.PasswordFile != "":
			if _, err := ReadSecretFile(s.PasswordFile); err != nil {
				ix.add("kafka.sasl.password_file", "%v", err)
			}
		case s.Password == "":
			ix.add("kafka.sasl.password", "is required with SASL (or password_file)")
		}
	}
	if !tlsOn && !s.AllowPlaintext {
		ix.add("kafka.sasl", "SASL without TLS exposes the credentials on the network; "+
			"configure kafka.tls, or set kafka.sasl.allow_plaintext: true to accept that")
	}
}

func (c *Config) validateOAuth(ix *index, s *SASL) {
	switch {
	case s.TokenFile != "" && len(s.TokenCommand) > 0:
		ix.add("kafka.sasl.token_command", "token_file and token_command are mutually exclusive")
	case s.TokenFile != "":
		if _, err := ReadTokenFile(s.TokenFile); err != nil {
			ix.add("kafka.sasl.token_file", "%v", err)
		}
	case len(s.TokenCommand) > 0:
		if s.TokenCommand[0] == "" {
			ix.add("kafka.sasl.token_command[0]", "is empty: the first item is the program to run")
		} else if _, err := exec.LookPath(s.TokenCommand[0]); err != nil {
			ix.add("kafka.sasl.token_command[0]", "%v", err)
		}
	default:
		ix.add("kafka.sasl.token_file", "OAUTHBEARER needs token_file or token_command")
	}
	c.check(ix, "kafka.sasl.token_command_timeout", "")
	names := make([]string, 0, len(s.Extensions))
	for name := range s.Extensions {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		switch {
		case !extensionKeyRe.MatchString(name):
			ix.add("kafka.sasl.extensions."+name, "an extension name is letters only (RFC 7628)")
		case name == "auth":
			ix.add("kafka.sasl.extensions.auth", "auth is reserved for the token")
		case strings.ContainsAny(s.Extensions[name], "\x01"):
			ix.add("kafka.sasl.extensions."+name, "must not contain the byte 0x01")
		}
	}
}

func contains(list []string, v string) bool {
	for _, s := range list {
		if s == v {
			return true
		}
	}
	return false
}
