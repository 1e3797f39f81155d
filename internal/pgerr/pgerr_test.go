package pgerr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func sqlstate(code string) error {
	return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code, Message: "m"})
}

// TestClassify: every class of error gets one answer to each question.
func TestClassify(t *testing.T) {
	tests := []struct {
		name                            string
		err                             error
		unavailable, refused, retryable bool
	}{
		{"nil", nil, false, false, false},
		{"connection exception", sqlstate("08006"), true, false, false},
		{"disk full", sqlstate("53100"), true, false, false},
		{"too many connections", sqlstate("53300"), true, false, false},
		{"admin shutdown", sqlstate("57P01"), true, false, false},
		{"cannot connect now", sqlstate("57P03"), true, false, false},
		{"statement timeout", sqlstate("57014"), false, true, false},
		{"io error", sqlstate("58030"), true, false, false},
		{"read-only transaction", sqlstate("25006"), true, false, false},
		{"read-only transaction relayed by Citus", fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "XX000",
			Message: "cannot execute INSERT in a read-only transaction"}), true, false, false},
		{"read-only session", fmt.Errorf("acquire: %w", pgerr.ErrReadOnly), true, false, false},
		{"division by zero", sqlstate("22012"), false, true, false},
		{"unique violation", sqlstate("23505"), false, true, false},
		{"insufficient privilege", sqlstate("42501"), false, true, false},
		{"serialization failure", sqlstate("40001"), false, true, true},
		{"deadlock", sqlstate("40P01"), false, true, true},
		{"raise exception", sqlstate("P0001"), false, true, false},
		{"server error without an SQLSTATE", fmt.Errorf("wrapped: %w", &pgconn.PgError{Message: "m"}), false, true, false},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true, false, false},
		{"deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), true, false, false},
		{"cancelled", context.Canceled, false, false, false},
		{"configuration", errors.New("aggregates.x.sql: no such column"), false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pgerr.Unavailable(tt.err); got != tt.unavailable {
				t.Errorf("Unavailable = %v, want %v", got, tt.unavailable)
			}
			if got := pgerr.Refused(tt.err); got != tt.refused {
				t.Errorf("Refused = %v, want %v", got, tt.refused)
			}
			if got := pgerr.Retryable(tt.err); got != tt.retryable {
				t.Errorf("Retryable = %v, want %v", got, tt.retryable)
			}
		})
	}
}

// TestBadRow: the row's content is at fault, not the batch or the table.
func TestBadRow(t *testing.T) {
	for code, want := range map[string]bool{
		"22001": true, "22P02": true, "23502": true, "23514": false, "54000": true, "P0001": true,
		"23505": false, "42P01": false, "40001": false, "08006": false,
	} {
		err := error(&pgconn.PgError{Code: code})
		if code == "23514" {
			// A check violation that names its constraint is the row's.
			if !pgerr.BadRow(&pgconn.PgError{Code: code, ConstraintName: "no_bad"}) {
				t.Errorf("BadRow(23514 of a named constraint) = false")
			}
		}
		if got := pgerr.BadRow(err); got != want {
			t.Errorf("BadRow(%s) = %v, want %v", code, got, want)
		}
	}
}

// TestFromServer: errors as a real server and the driver report them.
func TestFromServer(t *testing.T) {
	ctx := context.Background()
	pool, dsn := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY) ;
		CREATE TABLE p (at date NOT NULL) PARTITION BY RANGE (at);
		INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, "INSERT INTO t VALUES (1)")
	if !pgerr.UniqueViolation(err) || !pgerr.Refused(err) || pgerr.BadRow(err) {
		t.Errorf("duplicate key: %v", err)
	}
	_, err = pool.Exec(ctx, "INSERT INTO p VALUES ('2026-10-01')")
	if !pgerr.MissingPartition(err) || pgerr.BadRow(err) {
		t.Errorf("no partition for the row: %v", err)
	}
	_, err = pool.Exec(ctx, "SELECT * FROM tidemark_missing.kafka_offsets")
	if !pgerr.UndefinedTable(err) || !pgerr.Refused(err) || pgerr.UndefinedTable(sqlstate("42704")) {
		t.Errorf("missing table: %v", err)
	}
	_, err = pool.Exec(ctx, "SELEC 1")
	if pos, ok := pgerr.SyntaxError(err); !ok || pos != 1 {
		t.Errorf("syntax error: %v at %d", err, pos)
	}
	_, err = pool.Exec(ctx, "SELECT 1/0")
	if !pgerr.BadRow(err) || !pgerr.Refused(err) {
		t.Errorf("division by zero: %v", err)
	}
	_, err = pool.Exec(ctx, "SET statement_timeout = '10ms'; SELECT pg_sleep(1)")
	if !pgerr.Refused(err) || pgerr.Unavailable(err) {
		t.Errorf("statement timeout: %v", err)
	}
	ro := pgtest.Conn(t, dsn)
	if _, err := ro.Exec(ctx, "SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	_, err = ro.Exec(ctx, "INSERT INTO t VALUES (2)")
	if !pgerr.ReadOnly(err) || !pgerr.Unavailable(err) || pgerr.Refused(err) {
		t.Errorf("a write in a read-only session: %v", err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	unknown := cfg.Copy()
	unknown.Database = "no_such_database"
	_, err = pgx.ConnectConfig(ctx, unknown)
	if !pgerr.ConnectFailure(err) || !pgerr.Refused(err) || pgerr.Unavailable(err) {
		t.Errorf("unknown database: %v", err)
	}
	cfg.Port, cfg.ConnectTimeout = 1, time.Second
	_, err = pgx.ConnectConfig(ctx, cfg)
	if !pgerr.Unavailable(err) || pgerr.Refused(err) || !pgerr.ConnectFailure(err) {
		t.Errorf("refused connection: %v", err)
	}
	if _, err := pool.Exec(ctx, "SELECT 1/0"); pgerr.ConnectFailure(err) {
		t.Errorf("a statement's error taken for a failure to connect: %v", err)
	}
}

// TestFromCitus: a Citus coordinator relays a worker's refusal of a COPY
// row for a missing partition or a duplicate key without its SQLSTATE, and
// a violated CHECK constraint without the constraint's name; each is still
// classified as on one server.
func TestFromCitus(t *testing.T) {
	ctx := context.Background()
	// One session: citus.enable_unsafe_triggers is set in it.
	conn := pgtest.Conn(t, pgtest.SharedCluster(t).NewDatabase(t, pgtest.ClusterOptions{}))
	if _, err := conn.Exec(ctx, `CREATE TABLE p (id text NOT NULL, at date NOT NULL) PARTITION BY RANGE (at);
		SELECT create_distributed_table('p', 'id')`); err != nil {
		t.Fatal(err)
	}
	_, err := conn.CopyFrom(ctx, pgx.Identifier{"p"}, []string{"id", "at"}, pgx.CopyFromRows([][]any{{"a", time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)}}))
	if !pgerr.MissingPartition(err) || pgerr.BadRow(err) {
		t.Errorf("no partition for a COPY row: %v (SQLSTATE %s)", err, pgerr.Code(err))
	}
	_, err = conn.Exec(ctx, "INSERT INTO p VALUES ('a', '2026-10-01')")
	if !pgerr.MissingPartition(err) || pgerr.BadRow(err) {
		t.Errorf("no partition for an inserted row: %v (SQLSTATE %s)", err, pgerr.Code(err))
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE p_1 PARTITION OF p FOR VALUES FROM ('2026-10-01') TO ('2026-10-02');
		ALTER TABLE p ADD PRIMARY KEY (id, at); INSERT INTO p VALUES ('a', '2026-10-01')`); err != nil {
		t.Fatal(err)
	}
	_, err = conn.CopyFrom(ctx, pgx.Identifier{"p"}, []string{"id", "at"}, pgx.CopyFromRows([][]any{{"a", time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)}}))
	if !pgerr.UniqueViolation(err) || !pgerr.Refused(err) || pgerr.BadRow(err) {
		t.Errorf("a COPY row with a key stored before: %v (SQLSTATE %s)", err, pgerr.Code(err))
	}
	if pgerr.Relayed(err) {
		t.Errorf("a recognised relayed refusal reported as unexplained: %v", err)
	}
	if _, err := conn.Exec(ctx, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused %', NEW.id USING ERRCODE = 'data_exception'; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET citus.enable_unsafe_triggers = on`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TRIGGER refuse BEFORE INSERT ON p_1 FOR EACH ROW WHEN (NEW.id = 'c') EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	_, err = conn.CopyFrom(ctx, pgx.Identifier{"p"}, []string{"id", "at"}, pgx.CopyFromRows([][]any{{"c", time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)}}))
	if !pgerr.Relayed(err) {
		t.Errorf("a COPY row a trigger refuses on a worker: %v (SQLSTATE %s), not reported as relayed", err, pgerr.Code(err))
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE p ADD CONSTRAINT early CHECK (id <> 'b')`); err != nil {
		t.Fatal(err)
	}
	for what, write := range map[string]func() error{
		"COPY": func() error {
			_, err := conn.CopyFrom(ctx, pgx.Identifier{"p"}, []string{"id", "at"}, pgx.CopyFromRows([][]any{{"b", time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)}}))
			return err
		},
		"INSERT": func() error {
			_, err := conn.Exec(ctx, "INSERT INTO p VALUES ('b', '2026-10-01')")
			return err
		},
	} {
		if err := write(); pgerr.MissingPartition(err) || !pgerr.BadRow(err) {
			t.Errorf("a %s row that violates a CHECK constraint: %v (SQLSTATE %s), taken for a missing partition", what, err, pgerr.Code(err))
		}
	}
}
