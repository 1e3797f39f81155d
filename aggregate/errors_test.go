package aggregate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/aggregate"
)

// rebuildErr wraps err as Rebuild and the callers wrap what the warehouse
// returns.
func rebuildErr(err error) error {
	return fmt.Errorf("reconcile daily_sales: rebuild: %w", fmt.Errorf("rebuild daily_sales 2026-10-05: %w", err))
}

// TestErrorClassification: which failed rebuilds are the partition's fault
// (recorded against it, the others go on), which mean that the warehouse
// cannot work (the caller stops and tries later), and which are retried at
// once.
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
		{"unique violation", &pgconn.PgError{Code: "23505"}, true, false},
		{"bad input", &pgconn.PgError{Code: "22P02"}, true, false},
		{"division by zero", &pgconn.PgError{Code: "22012"}, true, false},
		{"undefined column", &pgconn.PgError{Code: "42703"}, true, false},
		{"insufficient privilege", &pgconn.PgError{Code: "42501"}, true, false},
		{"lock timeout", &pgconn.PgError{Code: "55P03"}, true, false},
		{"raised by the query", &pgconn.PgError{Code: "P0001"}, true, false},
		{"internal error", &pgconn.PgError{Code: "XX000"}, true, false},
		{"statement timeout", &pgconn.PgError{Code: "57014"}, true, false},
		{"serialization failure", &pgconn.PgError{Code: "40001"}, true, true},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, true, true},
		{"outside the partition", aggregate.ErrOutsidePartition, true, false},
		{"archived", aggregate.ErrArchived, true, false},
		{"connection failure", &pgconn.PgError{Code: "08006"}, false, false},
		{"connection does not exist", &pgconn.PgError{Code: "08003"}, false, false},
		{"disk full", &pgconn.PgError{Code: "53100"}, false, false},
		{"out of memory", &pgconn.PgError{Code: "53200"}, false, false},
		{"too many connections", &pgconn.PgError{Code: "53300"}, false, false},
		{"administrator shutdown", &pgconn.PgError{Code: "57P01", Severity: "FATAL"}, false, false},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, false, false},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, false, false},
		{"database dropped", &pgconn.PgError{Code: "57P04"}, false, false},
		{"I/O error", &pgconn.PgError{Code: "58030"}, false, false},
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
				if got := aggregate.Retryable(err); got != tc.retryable {
					t.Errorf("Retryable(%v) = %v, want %v", err, got, tc.retryable)
				}
			}
			check(t, tc.err)
			check(t, rebuildErr(tc.err))
		})
	}
	if aggregate.PartitionFault(nil) || aggregate.Retryable(nil) {
		t.Error("a nil error is classified as a failure")
	}
}
