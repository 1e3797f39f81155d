// Package pgtest gives tests a real PostgreSQL: one private server per test
// binary, started on first use from the server binaries on the machine, and
// a fresh database per test.
//
// Set TIDEMARK_TEST_DATABASE_URL to run against an existing server instead;
// its role must be allowed to create databases. Set TIDEMARK_TEST_CITUS=1
// to put every test database on a Citus cluster the test binary starts
// (see Cluster). Test binaries that use this
// package call Main from TestMain so the private server is stopped and its
// directory removed when the tests end.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
)

// EnvURL names the variable that points tests at an existing server.
const EnvURL = "TIDEMARK_TEST_DATABASE_URL"

var (
	sharedOnce sync.Once
	shared     *pgserver.Server
	sharedErr  error
)

// Main runs the tests and then stops the shared server, if one was started.
func Main(m *testing.M) {
	code := m.Run()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	if sharedCluster != nil {
		if err := sharedCluster.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	os.Exit(code)
}

// adminURL returns the URL of a database on the test server that new test
// databases can be created from.
func adminURL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared, sharedErr = pgserver.Start(ctx, pgserver.Options{})
	})
	if sharedErr != nil {
		tb.Fatalf("pgtest: start PostgreSQL: %v", sharedErr)
	}
	return shared.URL("postgres")
}

// NewDatabase creates an empty database for this test, dropped when the
// test ends, and returns its connection URL. Under EnvCitus the database
// is on the test binary's Citus cluster, with the extension created and
// the workers registered.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	if OnCitus() && os.Getenv(EnvURL) == "" {
		return SharedCluster(tb).NewDatabase(tb, ClusterOptions{})
	}
	return createDatabase(tb, adminURL(tb))
}

// NewDatabaseOn creates an empty database on the given server.
func NewDatabaseOn(tb testing.TB, srv *pgserver.Server) string {
	tb.Helper()
	return createDatabase(tb, srv.URL("postgres"))
}

func createDatabase(tb testing.TB, admin string) string {
	tb.Helper()
	return createNamed(tb, admin, newName())
}

// newName is a fresh test database name.
func newName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "tidemark_test_" + hex.EncodeToString(b[:])
}

// createNamed creates the database name on the server of admin, dropped
// when the test ends, and returns its connection URL.
func createNamed(tb testing.TB, admin, name string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		tb.Fatalf("pgtest: connect %s: %v", redact(admin), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgquote.Ident(name)+" TEMPLATE template0"); err != nil {
		tb.Fatalf("pgtest: create database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			tb.Logf("pgtest: drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgquote.Ident(name)+" WITH (FORCE)"); err != nil {
			tb.Logf("pgtest: drop %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", redact(admin), err)
	}
	u.Path = "/" + name
	return u.String()
}

// NewPool creates a fresh database and returns a pool connected to it,
// closed when the test ends.
func NewPool(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	dsn := NewDatabase(tb)
	return Pool(tb, dsn), dsn
}

// Pool connects a pool to dsn, closed when the test ends.
func Pool(tb testing.TB, dsn string) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		tb.Fatalf("pgtest: pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Conn connects one session to dsn, closed when the test ends: for tests
// whose settings or transaction must stay in one session.
func Conn(tb testing.TB, dsn string) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		tb.Fatalf("pgtest: connect %s: %v", redact(dsn), err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// NewServer starts a private server for one test, for tests that restart or
// reconfigure it. It is stopped when the test ends.
func NewServer(tb testing.TB, opts pgserver.Options) *pgserver.Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(ctx, opts)
	if err != nil {
		tb.Fatalf("pgtest: start PostgreSQL: %v", err)
	}
	tb.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			tb.Logf("pgtest: %v", err)
		}
	})
	return srv
}

func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}

// Rows runs sql and returns its rows as text lines, one per row (the
// values printed with fmt.Sprint), for comparing result sets.
func Rows(tb testing.TB, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string) []string {
	tb.Helper()
	rs, err := q.Query(context.Background(), sql)
	if err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (string, error) {
		vals, err := r.Values()
		return fmt.Sprint(vals...), err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// Lines runs sql with args and returns its rows as text lines, one per row,
// the values joined by " | ": times at midnight UTC as dates, other times
// in UTC to the minute, NULL as NULL, other values as they print.
func Lines(tb testing.TB, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string, args ...any) []string {
	tb.Helper()
	rs, err := q.Query(context.Background(), sql, args...)
	if err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (string, error) {
		vals, err := r.Values()
		cells := make([]string, len(vals))
		for i, v := range vals {
			cells[i] = cell(v)
		}
		return strings.Join(cells, " | "), err
	})
	if err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return out
}

func cell(v any) string {
	switch x := v.(type) {
	case time.Time:
		if x.Hour() == 0 && x.Minute() == 0 && x.Second() == 0 && x.Nanosecond() == 0 && x.Location() == time.UTC {
			return x.Format("2006-01-02")
		}
		return x.UTC().Format("2006-01-02 15:04")
	case nil:
		return "NULL"
	}
	if s, ok := v.(fmt.Stringer); ok {
		return s.String()
	}
	if n, ok := v.(interface{ Value() (any, error) }); ok {
		if val, err := n.Value(); err == nil {
			return fmt.Sprint(val)
		}
	}
	return fmt.Sprint(v)
}

// Equal reports, as a test error naming what, lines that differ from want.
func Equal(tb testing.TB, what string, got, want []string) {
	tb.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		tb.Errorf("%s:\n got  %q\n want %q", what, got, want)
	}
}

// MatrixEnv is set by .ci/matrix for the tests it runs on a version other
// than the default.
const MatrixEnv = "TIDEMARK_MATRIX"

// CitusIndependent skips t in CI's short Citus run (make test-citus
// CITUS_FLAGS=-short): a test of what a Citus warehouse does not change
// but the server's version may (the replication session and slots of a
// source, a Kafka topic's reset). It runs with make test, in the version
// matrix, and in the full make test-citus.
func CitusIndependent(t testing.TB) {
	t.Helper()
	if testing.Short() && OnCitus() {
		t.Skip("a Citus warehouse does not change what it tests: run by make test, make test-matrix and the full make test-citus")
	}
}

// ServerIndependent skips t in CI's short runs on servers other than the
// default, the version matrix (make test-matrix MATRIX_FLAGS=-short) and
// the Citus run (make test-citus CITUS_FLAGS=-short): a test of what
// depends neither on the server's version nor on a Citus warehouse
// (network faults, Kafka authentication, schema registries, how records
// decode, the memory budget). It runs with make test on the default
// server, and in the full matrix and Citus runs.
func ServerIndependent(t testing.TB) {
	t.Helper()
	if testing.Short() && (os.Getenv(MatrixEnv) != "" || OnCitus()) {
		t.Skip("depends neither on the server's version nor on Citus: run by make test, the full make test-matrix and make test-citus")
	}
}
