package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/grants"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
)

// TestPreflightVerdict: `tidemark run` stops for missing privileges, but
// not for a check cut short by a lost connection (found by TestChaos: a
// PostgreSQL restart during the check made run exit with status 1).
func TestPreflightVerdict(t *testing.T) {
	missing := &grants.MissingError{Problems: []string{"sources.x.poll: role r lacks SELECT on t"}}
	lost := fmt.Errorf("check privileges: SELECT of role r: %w", io.ErrUnexpectedEOF)
	tests := []struct {
		name string
		err  error
		want error
		warn bool
	}{
		{"passed", nil, nil, false},
		{"missing privileges", missing, missing, false},
		{"missing privileges, wrapped", fmt.Errorf("sources.x: %w", missing), missing, false},
		{"connection lost during the check", lost, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out syncbuf.Buffer
			got := preflightVerdict(tt.err, slog.New(slog.NewTextHandler(&out, nil)))
			if (got == nil) != (tt.want == nil) || (tt.want != nil && !errors.Is(got, tt.want)) {
				t.Errorf("preflightVerdict(%v) = %v, want %v", tt.err, got, tt.want)
			}
			if warned := strings.Contains(out.String(), "cannot check privileges now"); warned != tt.warn {
				t.Errorf("warned = %v, want %v; log: %s", warned, tt.warn, out.String())
			}
		})
	}
}

// TestGrantsDatabaseNames runs the script of `tidemark grants` with psql
// (psql -v ON_ERROR_STOP=1 -f FILE, in a scratch working directory) for
// warehouse databases of unusual names. A name with quotes, spaces, a
// backquoted command, psql variables, a backslash, a connection string, a
// URI or non-ASCII letters is connected to. A name with a control
// character, which could end the \connect line (the database of
// postgres://h/wh%0A%5C%21%20touch%20pwned%0A is "wh\n\! touch pwned\n"),
// is refused with status 2 naming warehouse.dsn. Either way no shell
// command runs: the file that each name would touch, in the working
// directory or at an absolute path, does not appear.
func TestGrantsDatabaseNames(t *testing.T) {
	srv := pgtest.NewServer(t, pgserver.Options{})
	admin := pgtest.Pool(t, srv.SocketURL("postgres"))
	ctx := context.Background()
	// A short absolute path: a database name holds at most 63 bytes.
	dir, err := os.MkdirTemp("", "tm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// psql runs in cwd; a name touches pwned, or pwned in cwd.
	cwd, pwned := filepath.Join(dir, "cwd"), filepath.Join(dir, "pwned")
	if err := os.Mkdir(cwd, 0o755); err != nil {
		t.Fatal(err)
	}
	dsn := func(db string) string { return "postgres://tidemark@127.0.0.1:1/" + url.PathEscape(db) }
	tests := []struct {
		name, dsn string
		refused   bool
		db        string // the database connected to, unless refused
	}{
		{name: "a newline and a shell command", dsn: "postgres://tidemark@127.0.0.1:1/wh%0A%5C%21%20touch%20pwned%0A", refused: true},
		{name: "newlines, an absolute path", dsn: dsn("wh\n\\! touch " + pwned + "\n"), refused: true},
		{name: "carriage returns", dsn: dsn("wh\r\\! touch " + pwned + "\r"), refused: true},
		{name: "a tab", dsn: dsn("wh\t\\! touch " + pwned), refused: true},
		{name: "quotes and spaces", db: `my "ware" 'house'`},
		{name: "a backquoted command", db: "wh `touch " + pwned + "`"},
		{name: "psql variables", db: `wh :DBNAME :'DBNAME' :"DBNAME"`},
		{name: "a backslash", db: `wh \! touch ` + pwned},
		{name: "a connection string", db: "wh host=/nonexistent port=1"},
		{name: "a URI", db: "postgresql://nonexistent/wh"},
		{name: "non-ASCII", db: "entrepôt ✓"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.dsn == "" {
				tt.dsn = dsn(tt.db)
				if _, err := admin.Exec(ctx, "CREATE DATABASE "+grants.Ident(tt.db)); err != nil {
					t.Fatal(err)
				}
			}
			cfg := writeFile(t, "tidemark.yaml", fmt.Sprintf("warehouse: {dsn: %q}\n", tt.dsn)+strings.SplitN(validConfig, "\n", 3)[2])
			code, script, errOut := invoke(t, "grants", "-c", cfg)
			var out string
			var runErr error
			if script != "" {
				out, runErr = runScript(t, srv, cwd, script)
			}
			for _, f := range []string{pwned, filepath.Join(cwd, "pwned")} {
				if _, err := os.Stat(f); err == nil {
					t.Errorf("running the script created %s", f)
					_ = os.Remove(f)
				}
			}
			if tt.refused {
				if code != exitUsage || !strings.Contains(errOut, "warehouse.dsn") || script != "" {
					t.Errorf("grants: exit %d, stderr %q, %d bytes of script; want exit %d naming warehouse.dsn, no script", code, errOut, len(script), exitUsage)
				}
				return
			}
			if code != exitOK || runErr != nil {
				t.Fatalf("grants: exit %d: %s; psql: %v\n%s\nscript:\n%s", code, errOut, runErr, out, script)
			}
			cc, err := pgx.ParseConfig(srv.SocketURL("postgres"))
			if err != nil {
				t.Fatal(err)
			}
			cc.Database = tt.db
			conn, err := pgx.ConnectConfig(ctx, cc)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var owner string
			if err := conn.QueryRow(ctx, `SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'tidemark'`).Scan(&owner); err != nil || owner != "tidemark_owner" {
				t.Errorf("schema tidemark in database %q: owner %q (%v), want tidemark_owner", tt.db, owner, err)
			}
		})
	}
}

// runScript runs script as a file with psql as the header of the script
// says (psql -v ON_ERROR_STOP=1 -f FILE), as the superuser through the
// socket, in working directory dir.
func runScript(t *testing.T, srv *pgserver.Server, dir, script string) (string, error) {
	t.Helper()
	bin, err := pgserver.FindPSQL()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "grants.sql")
	if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", srv.SocketURL("postgres"), "-f", file)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}
