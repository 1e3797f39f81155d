package aggregate

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// queryCanceled is the SQLSTATE of a statement cancelled by
// statement_timeout or by a cancel request. It belongs to class 57
// (operator intervention) but is the statement's own doing.
const queryCanceled = "57014"

// PartitionFault reports whether a failed rebuild is the fault of the
// partition being rebuilt, so that other partitions can get past it: the
// warehouse ran the work and refused it. That is any SQL error raised by
// the partition's data, the aggregate's query or the target table (bad
// input, a constraint, a division by zero, missing privileges), a
// statement timeout (57014), a deadlock or serialization failure that
// persisted after its retries (see Retryable), rows outside the partition
// (ErrOutsidePartition) and an archived partition (ErrArchived). Callers
// record such a failure against the partition and go on with the others.
//
// It reports false when the warehouse itself cannot work: SQLSTATE
// classes 08 (connection exception), 53 (insufficient resources: disk
// full, out of memory, too many connections), 57 (operator intervention:
// an administrator shutdown, a crash shutdown, a database that cannot be
// connected to now) except 57014, and 58 (system error, such as an I/O
// error); a failure to connect; and any error without an SQLSTATE (a
// lost connection, a cancelled context). The next partition would fail
// the same way, so callers stop and try again later without blaming the
// partition.
func PartitionFault(err error) bool {
	if err == nil {
		return false
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == queryCanceled || len(pgErr.Code) < 2 {
			return true
		}
		switch pgErr.Code[:2] {
		case "08", "53", "57", "58":
			return false
		}
		return true
	}
	return errors.Is(err, ErrOutsidePartition) || errors.Is(err, ErrArchived)
}

// Retryable reports whether a rebuild lost a race with another
// transaction, a serialization failure (40001) or a deadlock (40P01), and
// may succeed when its transaction is run again at once. Callers try it a
// few times before they treat it as the partition's fault (see
// PartitionFault).
func Retryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "40001" || pgErr.Code == "40P01"
}

// RebuildAttempts is how many times callers run a rebuild's transaction
// when it keeps failing with a Retryable error.
const RebuildAttempts = 3
