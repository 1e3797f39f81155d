package aggregate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// rebuildErr wraps err as Rebuild and the callers wrap what the warehouse
// returns.
func rebuildErr(err error) error {
	return fmt.Errorf("reconcile daily_sales: rebuild: %w", fmt.Errorf("rebuild daily_sales 2026-10-05: %w", err))
}

// TestErrorClassification: which failed rebuilds are the partition's fault
// (recorded against it, the others go on), which mean that the warehouse
// cannot work (the caller stops and tries later), and which are retried at
// once (pgerr.Retryable, as the callers of Rebuild ask).
func TestErrorClassification(t *testing.T) {
	// A connection refused: nothing listens on port 1.
	_, connectErr := pgconn.Connect(context.Background(), "postgres://tidemark@127.0.0.1:1/tidemark?connect_timeout=5")
	var ce *pgconn.ConnectError
	if !errors.As(connectErr, &ce) {
		t.Fatalf("connecting to a closed port: got %v, want a *pgconn.ConnectError", connectErr)
	}
	for _, tc := range []struct {
		name      string
		err       error
		fault     bool
		retryable bool
	}{
		{"unique violation", &pgconn.PgError{Code: pgerrcode.UniqueViolation}, true, false},
		{"bad input", &pgconn.PgError{Code: pgerrcode.InvalidTextRepresentation}, true, false},
		{"division by zero", &pgconn.PgError{Code: pgerrcode.DivisionByZero}, true, false},
		{"undefined column", &pgconn.PgError{Code: pgerrcode.UndefinedColumn}, true, false},
		{"insufficient privilege", &pgconn.PgError{Code: pgerrcode.InsufficientPrivilege}, true, false},
		{"lock timeout", &pgconn.PgError{Code: pgerrcode.LockNotAvailable}, true, false},
		{"raised by the query", &pgconn.PgError{Code: pgerrcode.RaiseException}, true, false},
		{"internal error", &pgconn.PgError{Code: pgerrcode.InternalError}, true, false},
		{"statement timeout", &pgconn.PgError{Code: pgerrcode.QueryCanceled}, true, false},
		{"serialization failure", &pgconn.PgError{Code: pgerrcode.SerializationFailure}, true, true},
		{"deadlock", &pgconn.PgError{Code: pgerrcode.DeadlockDetected}, true, true},
		{"outside the partition", aggregate.ErrOutsidePartition, true, false},
		{"archived", aggregate.ErrArchived, true, false},
		{"connection failure", &pgconn.PgError{Code: pgerrcode.ConnectionFailure}, false, false},
		{"connection does not exist", &pgconn.PgError{Code: pgerrcode.ConnectionDoesNotExist}, false, false},
		{"disk full", &pgconn.PgError{Code: pgerrcode.DiskFull}, false, false},
		{"out of memory", &pgconn.PgError{Code: pgerrcode.OutOfMemory}, false, false},
		{"too many connections", &pgconn.PgError{Code: pgerrcode.TooManyConnections}, false, false},
		{"administrator shutdown", &pgconn.PgError{Code: pgerrcode.AdminShutdown, Severity: "FATAL"}, false, false},
		{"crash shutdown", &pgconn.PgError{Code: pgerrcode.CrashShutdown}, false, false},
		{"cannot connect now", &pgconn.PgError{Code: pgerrcode.CannotConnectNow}, false, false},
		{"database dropped", &pgconn.PgError{Code: pgerrcode.DatabaseDropped}, false, false},
		{"I/O error", &pgconn.PgError{Code: pgerrcode.IOError}, false, false},
		{"no SQLSTATE", &pgconn.PgError{}, true, false},
		{"connection refused", connectErr, false, false},
		{"lost connection", io.ErrUnexpectedEOF, false, false},
		{"cancelled", context.Canceled, false, false},
		{"not prepared", aggregate.ErrNotPrepared, false, false},
		{"other", errors.New("conn closed"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := func(t *testing.T, err error) {
				t.Helper()
				if got := aggregate.PartitionFault(err); got != tc.fault {
					t.Errorf("PartitionFault(%v) = %v, want %v", err, got, tc.fault)
				}
				if got := pgerr.Retryable(err); got != tc.retryable {
					t.Errorf("pgerr.Retryable(%v) = %v, want %v", err, got, tc.retryable)
				}
			}
			check(t, tc.err)
			check(t, rebuildErr(tc.err))
		})
	}
	if aggregate.PartitionFault(nil) {
		t.Error("a nil error is classified as a failure")
	}
}

// TestConnectFailureIsNotThePartitions: a connection the server refuses
// with an SQLSTATE of its own (here an unknown database) is not the fault
// of the partition it was for, though the server sent the error.
func TestConnectFailureIsNotThePartitions(t *testing.T) {
	_, dsn := pgtest.NewPool(t)
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = "no_such_database"
	_, err = pgconn.ConnectConfig(context.Background(), cfg)
	if !pgerr.Refused(err) {
		t.Fatalf("connecting to an unknown database: got %v, want an error the server sent", err)
	}
	if aggregate.PartitionFault(rebuildErr(err)) {
		t.Errorf("PartitionFault(%v) = true, want false", err)
	}
}
