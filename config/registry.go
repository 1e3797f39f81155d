package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"
)

// Source formats: how a Kafka source's record values are encoded. JSON
// values are loaded as they are; Avro, Protobuf and JSON Schema values are
// in the Confluent wire format, their schemas in the schema registry
// (SchemaRegistry); Debezium values are change events (the JSON
// converter, with or without schemas.enable, or the AvroConverter through
// the schema registry), kept in a mirror and stored as raw change rows.
const (
	FormatJSON       = "json"
	FormatAvro       = "avro"
	FormatProtobuf   = "protobuf"
	FormatJSONSchema = "json_schema"
	FormatDebezium   = "debezium"
)

// Formats lists the values of sources.<name>.format.
var Formats = []string{FormatJSON, FormatAvro, FormatProtobuf, FormatJSONSchema, FormatDebezium}

// UsesRegistry reports whether values of the format carry a schema id of
// the schema registry.
func UsesRegistry(format string) bool {
	return format == FormatAvro || format == FormatProtobuf || format == FormatJSONSchema
}

// SchemaRegistry is the Confluent-compatible schema registry that the
// sources of a registry format (Avro, Protobuf, JSON Schema) read their
// schemas from.
type SchemaRegistry struct {
	// URL is the registry's base URL, http or https.
	URL string `yaml:"url"`
	// Basic is HTTP basic authentication.
	Basic RegistryBasic `yaml:"basic"`
	// Bearer is bearer-token authentication.
	Bearer RegistryBearer `yaml:"bearer"`
	// TLS configures an https URL's connections.
	TLS RegistryTLS `yaml:"tls"`
	// Timeout bounds one request to the registry. Left out, it is 10s or
	// a quarter of kafka.rebalance_timeout, if smaller.
	Timeout Duration `yaml:"timeout"`

	// timeoutSet records that the file sets Timeout.
	timeoutSet bool
}

// minRegistryTimeout is the least schema_registry.timeout (its Min).
const minRegistryTimeout = 100 * time.Millisecond

// RegistryBasic is HTTP basic authentication to the schema registry.
type RegistryBasic struct {
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// PasswordFile holds the password instead of Password; read at load.
	PasswordFile string `yaml:"password_file"`
}

// RegistryBearer is bearer-token authentication to the schema registry.
type RegistryBearer struct {
	// TokenFile holds the token; it is read at each request, so that a
	// rotated file is picked up.
	TokenFile string `yaml:"token_file"`
}

// RegistryTLS configures the TLS connections to an https registry URL.
type RegistryTLS struct {
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// set reports whether any key of the block is set.
func (t RegistryTLS) set() bool { return t != RegistryTLS{} }

// validateRegistry checks the schema_registry block; needed names the
// first source whose format needs the registry ("" when none does).
func (c *Config) validateRegistry(ix *index, needed string) {
	r := c.SchemaRegistry
	// A poll waits for the registry up to two timeouts while it holds a
	// rebalance (see the ingester).
	switch {
	case !c.check(ix, "schema_registry.timeout", "") || needed == "" || 2*r.Timeout.Duration() < c.Kafka.RebalanceTimeout.Duration() || c.Kafka.RebalanceTimeout <= 0:
	case r.timeoutSet:
		ix.add("schema_registry.timeout", "must be less than half of kafka.rebalance_timeout (%s), got %s: a poll waits up to two timeouts for the registry while it holds a rebalance",
			c.Kafka.RebalanceTimeout, r.Timeout)
	default:
		ix.add("kafka.rebalance_timeout", "must be more than %s with a source of a registry format (sources.%s): a poll waits up to two schema_registry.timeout, at least %s each, for the registry while it holds a rebalance",
			Duration(2*minRegistryTimeout), needed, Duration(minRegistryTimeout))
	}
	if r.URL == "" {
		if needed != "" {
			ix.add("schema_registry.url", "is required by sources.%s.format: %s", needed, c.Sources[needed].Format)
		}
		return
	}
	u, err := url.Parse(r.URL)
	switch {
	case err != nil:
		ix.add("schema_registry.url", "is not a URL: %v", errors.Unwrap(err))
		return
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		ix.add("schema_registry.url", "must be an http:// or https:// URL with a host, got %q", r.URL)
		return
	case u.User != nil:
		ix.add("schema_registry.url", "must not hold credentials; use schema_registry.basic")
	}
	b := r.Basic
	basic := b != RegistryBasic{}
	switch {
	case basic && r.Bearer.TokenFile != "":
		ix.add("schema_registry.bearer.token_file", "basic and bearer are mutually exclusive")
	case basic && b.Username == "":
		ix.add("schema_registry.basic.username", "is required with basic authentication")
	case basic && b.Password == "":
		ix.add("schema_registry.basic.password", "is required with basic authentication (or password_file)")
	case r.Bearer.TokenFile != "":
		if _, err := ReadTokenFile(r.Bearer.TokenFile); err != nil {
			ix.add("schema_registry.bearer.token_file", "%v", err)
		}
	}
	if t := r.TLS; t.set() {
		if u.Scheme != "https" {
			ix.add("schema_registry.tls", "applies to an https:// URL only")
		}
		for key, f := range map[string]string{"ca_file": t.CAFile, "cert_file": t.CertFile, "key_file": t.KeyFile} {
			if f == "" {
				continue
			}
			if _, err := os.Stat(f); err != nil {
				ix.add("schema_registry.tls."+key, "cannot read %s: %v", f, errors.Unwrap(err))
			}
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			ix.add("schema_registry.tls.cert_file", "cert_file and key_file must be given together")
		}
	}
}

// validateFormat checks the format of source name; it returns whether
// the source reads the schema registry: a registry format does, and a
// Debezium source does when the registry is configured (for the records
// of the AvroConverter).
func (c *Config) validateFormat(ix *index, name string, s *Source) bool {
	if s.Kafka == nil {
		if s.Format != "" {
			ix.add(fmt.Sprintf("sources.%s.format", name), "applies to Kafka sources only")
		}
		return false
	}
	return c.check(ix, "sources.<name>.format", name) && (UsesRegistry(s.Format) || s.Format == FormatDebezium && c.SchemaRegistry.URL != "")
}
