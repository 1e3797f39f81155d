package config

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Secrets may be written into the file, taken from the environment with
// ${NAME}, or read from a file named by the key's *_file twin (as mounted
// Kubernetes or Docker secrets are). The *_file keys listed in secrets
// are read once, at load; kafka.sasl.password_file is checked at load and
// read again at each authentication (see ReadSecretFile). One trailing
// newline is dropped.

// secret is one value that may come from a file instead.
type secret struct {
	key, fileKey string
	value        *string
	file         string
}

// secrets lists every value with a *_file twin.
func (c *Config) secrets() []secret {
	out := []secret{
		{"warehouse.dsn", "warehouse.dsn_file", &c.Warehouse.DSN, c.Warehouse.DSNFile},
		{"http.token", "http.token_file", &c.HTTP.Token, c.HTTP.TokenFile},
		{"schema_registry.basic.password", "schema_registry.basic.password_file", &c.SchemaRegistry.Basic.Password, c.SchemaRegistry.Basic.PasswordFile},
	}
	for _, name := range c.SourceNames() {
		s := c.Sources[name]
		if s == nil {
			continue
		}
		p := "sources." + name
		if s.Poll != nil {
			out = append(out, secret{p + ".poll.dsn", p + ".poll.dsn_file", &s.Poll.DSN, s.Poll.DSNFile})
		}
		if s.CDC != nil {
			out = append(out, secret{p + ".cdc.dsn", p + ".cdc.dsn_file", &s.CDC.DSN, s.CDC.DSNFile},
				secret{p + ".cdc.standby_dsn", p + ".cdc.standby_dsn_file", &s.CDC.StandbyDSN, s.CDC.StandbyDSNFile},
				secret{p + ".cdc.primary_dsn", p + ".cdc.primary_dsn_file", &s.CDC.PrimaryDSN, s.CDC.PrimaryDSNFile})
		}
		if s.Mirror != nil {
			out = append(out, secret{p + ".mirror.source_dsn", p + ".mirror.source_dsn_file", &s.Mirror.SourceDSN, s.Mirror.SourceDSNFile})
		}
	}
	return out
}

// readSecretFiles fills each value from its *_file, before defaults and
// validation see it.
func (c *Config) readSecretFiles(ix *index) {
	for _, s := range c.secrets() {
		if s.file == "" {
			continue
		}
		if *s.value != "" {
			ix.add(s.fileKey, "%s and %s are both set; give one", s.key, s.fileKey)
			continue
		}
		v, err := ReadSecretFile(s.file)
		if err != nil {
			ix.add(s.fileKey, "%v", err)
			continue
		}
		*s.value = v
	}
}

// ReadSecretFile reads a file holding one secret: the contents without
// one trailing newline. It fails when the file cannot be read or holds
// nothing.
func ReadSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("cannot read %s: %w", path, errors.Unwrap(err))
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}
