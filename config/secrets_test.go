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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := tt.yaml + "\nsources:\n  t:\n    table: {name: events, key: [id], event_time: ts, ingested_at: loaded}\n"
			checkErrors(t, parseErrors(t, data, nil), tt.want)
		})
	}
}
