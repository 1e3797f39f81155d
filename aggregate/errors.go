package aggregate

import (
	"errors"

	"github.com/tidemark-dev/tidemark/internal/pgerr"
)

// PartitionFault reports whether a failed rebuild is the fault of the
// partition being rebuilt, so that other partitions can get past it: the
// warehouse ran the work and refused it (pgerr.Refused). That is any error
// the server sent about the partition's data, the aggregate's query or the
// target table (bad input, a constraint, a division by zero, missing
// privileges), a statement timeout, a deadlock or serialization failure
// that persisted after its retries (see pgerr.Retryable and
// RebuildAttempts), rows outside the partition (ErrOutsidePartition) and
// an archived partition (ErrArchived). Callers record such a failure
// against the partition and go on with the others.
//
// It reports false when the warehouse itself cannot work
// (pgerr.Unavailable: a lost connection, a full disk, a shutdown), for a
// failure to connect whatever the server answered (pgerr.ConnectFailure),
// and for any other error that the server did not send (a cancelled
// context). The next partition would fail the same way, so callers stop
// and try again later without blaming the partition.
func PartitionFault(err error) bool {
	if pgerr.ConnectFailure(err) {
		return false
	}
	return pgerr.Refused(err) || errors.Is(err, ErrOutsidePartition) || errors.Is(err, ErrArchived)
}

// RebuildAttempts is how many times callers run a rebuild's transaction
// when it keeps failing with an error pgerr.Retryable accepts (it lost a
// race with another transaction), before they treat it as the partition's
// fault (see PartitionFault).
const RebuildAttempts = 3
