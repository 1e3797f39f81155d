package cdc

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// durableCommitSQL makes the current transaction's commit wait until its
// WAL is on the warehouse's disk, when the session would not wait: with
// synchronous_commit = off a commit returns before its WAL is written,
// and a crash of the warehouse loses it after tidemark has acted on it.
// Every other setting waits at least for the local flush and is kept.
const durableCommitSQL = `SELECT set_config('synchronous_commit', 'local', true) WHERE current_setting('synchronous_commit') = 'off'`

// durable makes the commit of tx durable (see durableCommitSQL).
//
// Every warehouse write that tidemark acts on outside the warehouse goes
// through it: the stored position before the slot is confirmed up to it,
// and the claim of a slot before the slot is created. A commit the
// warehouse acknowledged and then lost in a crash would leave the slot
// confirmed beyond the changes in the mirrors, which are then gone for
// good. Flushing a commit's WAL flushes everything before it, so the
// groups committed earlier are durable with it.
func durable(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, durableCommitSQL); err != nil {
		return fmt.Errorf("set synchronous_commit: %w", err)
	}
	return nil
}

// execDurable runs sql on pool in a transaction of its own whose commit
// is durable.
func execDurable(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := durable(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql, args...)
		return err
	})
}
