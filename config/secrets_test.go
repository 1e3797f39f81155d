package config

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSecretFiles reads secrets from *_file keys and names the key when
// the file is missing, empty, or given along with the value itself.
func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dsn := write("dsn", "postgres://tidemark:pw@db/warehouse\n")
	src := write("src", "postgres://reader@src/app")
	token := write("token", "0123456789abcdef0123\r\n")
	empty := write("empty", "\n")
	short := write("short", "abc\n")
	twoNewlines := write("two-newlines", "0123456789abcdef0123\n\n")
	spaces := write("spaces", "                \n")
	missing := filepath.Join(dir, "missing")

	t.Run("read", func(t *testing.T) {
		cfg := mustParse(t, lines(
			"warehouse: {dsn_file: "+dsn+"}",
			"http: {token_file: "+token+"}",
			"sources:",
			"  customers:",
			"    poll: {dsn_file: "+src+", table: customers, key: [id], updated_at: updated_at}",
			"    mirror: {table: dw_customers}",
			"  shop:",
			"    cdc: {dsn_file: "+src+", tables: [orders]}",
			"    mirror: {schema: shop}",
		), nil)
		checks := map[string][2]string{
			"warehouse.dsn": {cfg.Warehouse.DSN, "postgres://tidemark:pw@db/warehouse"},
			"http.token":    {cfg.HTTP.Token, "0123456789abcdef0123"},
			"poll.dsn":      {cfg.Sources["customers"].Poll.DSN, "postgres://reader@src/app"},
			"cdc.dsn":       {cfg.Sources["shop"].CDC.DSN, "postgres://reader@src/app"},
		}
		for key, c := range checks {
			if c[0] != c[1] {
				t.Errorf("%s = %q, want %q", key, c[0], c[1])
			}
		}
	})

	tests := []struct {
		name string
		yaml string
		want []wantErr
	}{
		{"missing file", "warehouse: {dsn_file: " + missing + "}",
			[]wantErr{{1, "warehouse.dsn_file", "cannot read " + missing + ": no such file or directory"}}},
		{"empty file", "warehouse: {dsn_file: " + empty + "}",
			[]wantErr{{1, "warehouse.dsn_file", empty + " is empty"}}},
		{"both", "warehouse: {dsn: postgres://db/w, dsn_file: " + dsn + "}",
			[]wantErr{{1, "warehouse.dsn_file", "warehouse.dsn and warehouse.dsn_file are both set"}}},
		{"short token", "warehouse: {dsn: postgres://db/w}\nhttp: {token_file: " + short + "}",
			[]wantErr{{2, "http.token_file", "must be at least 16 characters, got 3"}}},
		{"short inline token", "warehouse: {dsn: postgres://db/w}\nhttp: {token: abc}",
			[]wantErr{{2, "http.token", "must be at least 16 characters, got 3"}}},
		{"blank token", "warehouse: {dsn: postgres://db/w}\nhttp: {token: \"                \"}",
			[]wantErr{{2, "http.token", "is blank"}}},
		{"blank token file", "warehouse: {dsn: postgres://db/w}\nhttp: {token_file: " + spaces + "}",
			[]wantErr{{2, "http.token_file", "is blank"}}},
		{"token file with two newlines", "warehouse: {dsn: postgres://db/w}\nhttp: {token_file: " + twoNewlines + "}",
			[]wantErr{{2, "http.token_file", "must not begin or end with white space (one trailing newline of the file is dropped"}}},
		{"token with a leading space", "warehouse: {dsn: postgres://db/w}\nhttp: {token: \" 0123456789abcdef0123\"}",
			[]wantErr{{2, "http.token", "must not begin or end with white space"}}},
		{"token with a space inside", "warehouse: {dsn: postgres://db/w}\nhttp: {token: \"0123456789 abcdef0123\"}",
			[]wantErr{{2, "http.token", "must be a bearer token as RFC 6750 defines it (b64token): letters, digits and - . _ ~ + /, then optionally = padding; character 11 is not allowed there"}}},
		{"token with a quote", "warehouse: {dsn: postgres://db/w}\nhttp: {token: '0123456789abcdef\"0123'}",
			[]wantErr{{2, "http.token", "character 17 is not allowed there"}}},
		{"token with padding inside", "warehouse: {dsn: postgres://db/w}\nhttp: {token: 0123456789abcdef=0123}",
			[]wantErr{{2, "http.token", "character 18 is not allowed there"}}},
		{"token of padding alone", "warehouse: {dsn: postgres://db/w}\nhttp: {token: \"================\"}",
			[]wantErr{{2, "http.token", "character 1 is not allowed there"}}},
		{"token with a non-ASCII letter", "warehouse: {dsn: postgres://db/w}\nhttp: {token: 0123456789abcdéf0123}",
			[]wantErr{{2, "http.token", "character 15 is not allowed there"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := tt.yaml + "\nsources:\n  t:\n    table: {name: events, key: [id], event_time: ts, ingested_at: loaded}\n"
			checkErrors(t, parseErrors(t, data, nil), tt.want)
		})
	}
}

// TestTokenSyntax accepts the bearer tokens that common generators write
// (base64, base64url, hexadecimal, with and without padding).
func TestTokenSyntax(t *testing.T) {
	for _, token := range []string{
		"0123456789abcdef0123456789abcdef",
		"q83vEjRWeJq8/+7dzLuqmQ==",
		"q83vEjRWeJq8_-7dzLuqmQ",
		"a.b~c-d_e+f/g0123456789===",
	} {
		t.Run(token, func(t *testing.T) {
			data := lines("warehouse: {dsn: postgres://db/w}", "http: {token: \""+token+"\"}",
				"sources:", "  t:", "    table: {name: events, key: [id], event_time: ts, ingested_at: loaded}")
			if cfg := mustParse(t, data, nil); cfg.HTTP.Token != token {
				t.Errorf("token = %q, want %q", cfg.HTTP.Token, token)
			}
		})
	}
}
