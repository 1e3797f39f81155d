// Package citus holds what tidemark asks of a warehouse that runs the Citus
// extension: whether it does, distributing a table, and waiting for the
// two-phase commits that the coordinator has committed but a worker has
// not yet.
//
// Citus commits a transaction that wrote on more than one node with
// two-phase commit: it prepares the transaction on each worker, commits
// the coordinator's own part, then sends COMMIT PREPARED to each worker.
// Between the coordinator's commit and a worker's COMMIT PREPARED, a
// snapshot taken on the coordinator counts the transaction as finished
// while its rows on that worker are not visible yet. AwaitPrepared closes
// that gap for a reader that bounds its work by a coordinator snapshot.
package citus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what the functions need of a connection or transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

const (
	enabledSQL = `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')`

	// isCitusTableSQL says whether a table is known to Citus in any form
	// (distributed, reference or Citus-local).
	isCitusTableSQL = `SELECT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = $1::regclass)`

	// distributeSQL distributes table $1 by column $2, colocated with
	// table $3, or in a colocation group of its own when $3 is 'none'.
	distributeSQL = `SELECT create_distributed_table($1, $2, colocate_with => $3)`

	// preparedOnWorkersSQL lists, from each worker, the prepared
	// transactions of this database whose names say that this node
	// started them: Citus names them citus_<group>_..., <group> being the
	// node's group id. A worker that does not answer is an error.
	preparedOnWorkersSQL = `
SELECT nodename, nodeport, success, result
FROM run_command_on_workers(format(
  $$SELECT coalesce(string_agg(gid, ' '), '') FROM pg_prepared_xacts
    WHERE database = current_database() AND gid LIKE 'citus\_%s\_%%'$$,
  (SELECT groupid FROM pg_dist_local_group)))`
)

// Enabled reports whether the database q is connected to has the citus
// extension.
func Enabled(ctx context.Context, q Querier) (bool, error) {
	var ok bool
	if err := q.QueryRow(ctx, enabledSQL).Scan(&ok); err != nil {
		return false, fmt.Errorf("look for the citus extension: %w", err)
	}
	return ok, nil
}

// Distribute makes table (a quoted, qualified name) a distributed table
// hashed by column, unless Citus knows it already. On an empty table it is
// quick; on a table holding rows, Citus copies them to the workers.
//
// colocateWith names the distributed table whose shards the table's are
// to be placed with, or is "" for a colocation group of the table's own.
// tidemark never leaves the choice to Citus: by default Citus joins any
// group of the same column type and shard count, whichever table made
// it, and refuses when the tables' collations differ.
func Distribute(ctx context.Context, q Querier, table, column, colocateWith string) error {
	var known bool
	if err := q.QueryRow(ctx, isCitusTableSQL, table).Scan(&known); err != nil {
		return fmt.Errorf("is %s distributed: %w", table, err)
	}
	if known {
		return nil
	}
	if colocateWith == "" {
		colocateWith = "none"
	}
	if _, err := q.Exec(ctx, distributeSQL, table, column, colocateWith); err != nil {
		return fmt.Errorf("distribute %s by %s: %w", table, column, err)
	}
	return nil
}

// Distributed reports whether table (a quoted, qualified name) is known to
// Citus; false on a database without the citus extension.
func Distributed(ctx context.Context, q Querier, table string) (bool, error) {
	on, err := Enabled(ctx, q)
	if err != nil || !on {
		return false, err
	}
	var known bool
	if err := q.QueryRow(ctx, isCitusTableSQL, table).Scan(&known); err != nil {
		return false, fmt.Errorf("is %s distributed: %w", table, err)
	}
	return known, nil
}

// CommitInTwoPhases makes the transaction open on conn commit its writes
// on the workers with two-phase commit, table being a distributed table.
//
// Citus commits a transaction whose writes reached a single worker, as a
// row-by-row INSERT's may, with a plain COMMIT sent to that worker before
// the coordinator commits its own part: a coordinator that fails between
// the two leaves the worker's rows committed and the coordinator's (the
// ledger, the offsets) not. A COPY into a distributed table always marks
// the transaction for two-phase commit, under which Citus prepares each
// worker's part, records it in the coordinator's own commit and finishes
// or rolls it back after a failure; a COPY of no rows does that and
// nothing else.
func CommitInTwoPhases(ctx context.Context, conn *pgconn.PgConn, table string) error {
	if _, err := conn.CopyFrom(ctx, strings.NewReader(""), "COPY "+table+" FROM STDIN"); err != nil {
		return fmt.Errorf("mark the transaction for two-phase commit: %w", err)
	}
	return nil
}

// keepCommitsDurableSQL sets synchronous_commit to local for the session
// when the database has the citus extension and the setting is off.
const keepCommitsDurableSQL = `
SELECT set_config('synchronous_commit', 'local', false)
FROM pg_settings
WHERE name = 'synchronous_commit' AND setting = 'off'
  AND EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')`

// KeepCommitsDurable turns synchronous_commit from off to local for the
// session of conn on a Citus coordinator, and does nothing elsewhere.
//
// Under synchronous_commit off a commit returns before its WAL is written,
// and on a coordinator Citus then sends COMMIT PREPARED to the workers: a
// coordinator that crashes next loses its own part of the transaction (a
// load's ledger row and offsets) while the workers keep theirs. On one
// server such a crash loses the whole load, which is loaded again; on a
// cluster it would split it.
func KeepCommitsDurable(ctx context.Context, conn *pgconn.PgConn) error {
	if _, err := conn.Exec(ctx, keepCommitsDurableSQL).ReadAll(); err != nil {
		return fmt.Errorf("keep commits durable on a Citus coordinator: %w", err)
	}
	return nil
}

// ErrInDoubt means that transactions prepared on workers stayed so for
// longer than AwaitPrepared waits: a coordinator session ended between
// its commit and the workers' COMMIT PREPARED. Citus's maintenance daemon
// finishes them within citus.recover_2pc_interval.
var ErrInDoubt = errors.New("transactions prepared on Citus workers are not finished")

// How AwaitPrepared waits: a COMMIT PREPARED takes milliseconds; one left
// in doubt by a coordinator session that ended between the two phases is
// finished by Citus's maintenance daemon within citus.recover_2pc_interval
// (a minute by default), and until then the caller fails and is retried.
const (
	preparedPoll = 10 * time.Millisecond
	preparedWait = 10 * time.Second
)

// AwaitPrepared waits until every transaction that this node had prepared
// on a worker when it was called is finished there (committed or rolled
// back), for at most 10 seconds (then ErrInDoubt). Called after a
// snapshot was taken on the coordinator, it makes the rows of every
// transaction that snapshot counts as committed visible on the workers to
// the statements that follow. A worker that does not answer is an error.
func AwaitPrepared(ctx context.Context, q Querier) error {
	return awaitPrepared(ctx, q, preparedPoll, preparedWait)
}

func awaitPrepared(ctx context.Context, q Querier, poll, wait time.Duration) error {
	first, err := prepared(ctx, q)
	if err != nil || len(first) == 0 {
		return err
	}
	deadline := time.Now().Add(wait)
	for {
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		now, err := prepared(ctx, q)
		if err != nil {
			return err
		}
		first = slices.DeleteFunc(first, func(g string) bool { return !slices.Contains(now, g) })
		if len(first) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %s: %s", ErrInDoubt, wait, strings.Join(first, ", "))
		}
	}
}

// prepared lists the names of the transactions this node has prepared on
// the workers.
func prepared(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, preparedOnWorkersSQL)
	if err != nil {
		return nil, fmt.Errorf("list the transactions prepared on the Citus workers: %w", err)
	}
	defer rows.Close()
	var gids []string
	for rows.Next() {
		var node, result string
		var port int
		var ok bool
		if err := rows.Scan(&node, &port, &ok, &result); err != nil {
			return nil, fmt.Errorf("list the transactions prepared on the Citus workers: %w", err)
		}
		if !ok {
			return nil, fmt.Errorf("list the transactions prepared on Citus worker %s:%d: %s", node, port, result)
		}
		gids = append(gids, strings.Fields(result)...)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list the transactions prepared on the Citus workers: %w", err)
	}
	return gids, nil
}
