// Package pgerr is the one classifier of errors from PostgreSQL, used by
// every component: by SQLSTATE, named with github.com/jackc/pgerrcode, and
// by the driver's errors of connections that failed or were lost. Each
// caller asks one question:
//
//   - Unavailable: the server cannot do any work now (it cannot be
//     reached, the connection broke, it is starting, stopping or out of
//     resources, or it is read-only: a standby, or a primary being
//     failed over). Retry later, with backoff, on a new connection,
//     without blaming the work.
//   - Refused: the server ran the statement and refused it (bad input, a
//     constraint, a privilege, a timeout of the statement itself). The
//     work is at fault; retrying it unchanged fails the same way.
//   - Retryable: the statement lost a race with another transaction (a
//     serialization failure or a deadlock) and may succeed if run again
//     at once.
//
// and a few predicates name single SQLSTATEs callers act on, or a failure
// to connect (ConnectFailure).
package pgerr

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// Code returns the SQLSTATE of err, or "" when err carries none (a
// failure to connect, a lost connection, a cancelled context). A Citus
// coordinator relays a worker's refusal of a COPY row as an internal error
// (XX000) that keeps only the worker's message; for the refusals tidemark
// acts on, Code returns the SQLSTATE the message stands for.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	if pgErr.Code == pgerrcode.InternalError {
		for _, r := range relayed {
			if strings.HasPrefix(pgErr.Message, r.prefix) && strings.Contains(pgErr.Message, r.contains) {
				return r.code
			}
		}
	}
	return pgErr.Code
}

// Relayed reports an internal error (XX000) that is not one of the
// refusals Code recognises: on a Citus warehouse, a worker's refusal of a
// COPY row relayed without its SQLSTATE (a data exception, a trigger's
// exception, ...). Whether the row is at fault is known only by writing
// the rows again one at a time, whose errors keep their SQLSTATE.
func Relayed(err error) bool { return Code(err) == pgerrcode.InternalError }

// relayed are the messages of a worker's refusal of a COPY row that a
// Citus coordinator relays without their SQLSTATE (a message that begins
// with prefix and contains contains), by the SQLSTATE they have on the
// worker.
var relayed = []struct{ prefix, contains, code string }{
	{"duplicate key value violates unique constraint ", "", pgerrcode.UniqueViolation},
	{"no partition of relation ", "", pgerrcode.CheckViolation},
	{"new row for relation ", " violates check constraint ", pgerrcode.CheckViolation},
	{"cannot execute ", " in a read-only transaction", pgerrcode.ReadOnlySQLTransaction},
}

// Is reports whether err carries SQLSTATE code.
func Is(err error, code string) bool { return err != nil && Code(err) == code }

// Unavailable reports whether err says the server cannot do any work now,
// whatever the work: a failure to connect, a lost or timed-out
// connection, a deadline, or an SQLSTATE of class 08 (connection
// exception), 53 (insufficient resources: disk full, out of memory, too
// many connections), 57 (operator intervention: shutdown, crash recovery,
// a database not accepting connections) except query_canceled, or 58
// (system error, such as an I/O error), or a read-only server (ReadOnly,
// ErrReadOnly).
// The next attempt at any other work would fail the same way.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrReadOnly) {
		return true
	}
	if code := Code(err); code != "" {
		switch code {
		case pgerrcode.QueryCanceled:
			return false
		case pgerrcode.ReadOnlySQLTransaction:
			return true
		}
		switch code[:min(2, len(code))] {
		case "08", "53", "57", "58":
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, context.DeadlineExceeded)
}

// Refused reports whether the server ran the statement and refused it: an
// error the server sent (a *pgconn.PgError, whatever its SQLSTATE) that
// Unavailable does not claim. A statement cancelled by statement_timeout
// (query_canceled) is refused: it is the statement's own doing.
func Refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && !Unavailable(err)
}

// ConnectFailure reports whether err is a failure to connect, whatever
// the server said if it answered: a refused password or an unknown
// database (which Unavailable leaves to Refused) as much as an address
// nothing listens on. Such an error is never the fault of the work the
// connection was for.
func ConnectFailure(err error) bool {
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr)
}

// Retryable reports whether err is a serialization failure or a deadlock:
// the statement lost a race with another transaction and may succeed when
// its transaction is run again at once.
func Retryable(err error) bool {
	switch Code(err) {
	case pgerrcode.SerializationFailure, pgerrcode.DeadlockDetected:
		return true
	}
	return false
}

// ReadOnly reports a write refused because the transaction is read-only
// (25006, "cannot execute ... in a read-only transaction"), or a session
// found read-only before it was used (ErrReadOnly). tidemark never makes
// its own writing transactions read-only: the session is on a hot
// standby, a primary whose failover demoted or fenced it
// (default_transaction_read_only), or a server that has not finished a
// promotion. It is Unavailable: the work is not at fault, and a new
// connection to a multi-host warehouse.dsn with
// target_session_attrs=read-write finds the primary.
func ReadOnly(err error) bool {
	return Is(err, pgerrcode.ReadOnlySQLTransaction) || errors.Is(err, ErrReadOnly)
}

// ErrReadOnly is the error of a session that its server reports
// read-only, given up on before it was used.
var ErrReadOnly = errors.New("the session's server is read-only (a standby, or a primary demoted or fenced by a failover)")

// UniqueViolation reports a duplicate key (23505).
func UniqueViolation(err error) bool { return Is(err, pgerrcode.UniqueViolation) }

// LockNotAvailable reports a lock_timeout (55P03).
func LockNotAvailable(err error) bool { return Is(err, pgerrcode.LockNotAvailable) }

// QueryCanceled reports a statement cancelled (57014), by
// statement_timeout or by a request to cancel it.
func QueryCanceled(err error) bool { return Is(err, pgerrcode.QueryCanceled) }

// ObjectInUse reports an object in use by another session (55006), such
// as a replication slot another process holds.
func ObjectInUse(err error) bool { return Is(err, pgerrcode.ObjectInUse) }

// UndefinedObject reports an object that does not exist (42704), such as
// a replication slot.
func UndefinedObject(err error) bool { return Is(err, pgerrcode.UndefinedObject) }

// UndefinedTable reports a table, view or sequence that does not exist
// (42P01): one of tidemark's own when the warehouse has not been migrated.
func UndefinedTable(err error) bool { return Is(err, pgerrcode.UndefinedTable) }

// InsufficientPrivilege reports a missing privilege (42501).
func InsufficientPrivilege(err error) bool { return Is(err, pgerrcode.InsufficientPrivilege) }

// InvalidAuthorization reports a refused role or authentication method
// (28000).
func InvalidAuthorization(err error) bool {
	return Is(err, pgerrcode.InvalidAuthorizationSpecification)
}

// SyntaxError returns the 1-based character position of a syntax error
// (42601) in the statement, and whether err is one with a position.
func SyntaxError(err error) (int, bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.SyntaxError || pgErr.Position < 1 {
		return 0, false
	}
	return int(pgErr.Position), true
}

// MissingPartition reports an undefined table (42P01) or PostgreSQL's "no
// partition of relation found for row", a check violation (23514) that,
// unlike a violated CHECK constraint, names no constraint and does not say
// it violates one: a raw partition went (retention dropped it) while a
// load was writing into it.
func MissingPartition(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch Code(err) {
	case pgerrcode.UndefinedTable:
		return true
	case pgerrcode.CheckViolation:
		// A Citus coordinator relays a worker's violated CHECK constraint
		// without the constraint's name; its message still says so.
		return pgErr.ConstraintName == "" && !strings.Contains(pgErr.Message, " violates check constraint ")
	}
	return false
}

// BadRow reports whether PostgreSQL refused a row's content: a data
// exception (class 22), an integrity constraint an operator added (class
// 23, except a duplicate key, which is a concurrent insert, and a missing
// partition), a program limit such as an oversized index row (class 54),
// or an exception raised by a trigger (P0001).
func BadRow(err error) bool {
	code := Code(err)
	switch {
	case code == "":
		return false
	case pgerrcode.IsDataException(code), pgerrcode.IsProgramLimitExceeded(code), code == pgerrcode.RaiseException:
		return true
	case pgerrcode.IsIntegrityConstraintViolation(code):
		return code != pgerrcode.UniqueViolation && !MissingPartition(err)
	}
	return false
}
