// Package pause keeps the sources an operator paused, in the warehouse
// table tidemark.source_pauses, for every instance to obey: a paused
// Kafka source's topics are not fetched (the group membership and the
// stored offsets stay), a paused CDC source's reader leaves its slot
// unread (the slot stays, and keeps WAL), a paused poll source's runs are
// skipped. What each instance knows of the table is a Watch, read again
// every few seconds; the components ask it, by source name, whether to
// stand still.
package pause

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pause is one paused source.
type Pause struct {
	Source string    `json:"source"`
	Since  time.Time `json:"since"`
	// By is who paused it: the operating-system user of the command.
	By string `json:"by"`
	// Reason is the command's --reason; empty when none was given.
	Reason string `json:"reason,omitempty"`
}

// String says since when and by whom the source is paused, and why:
// "since 2026-12-07T14:50:00Z by alice: reindexing".
func (p Pause) String() string {
	s := fmt.Sprintf("since %s by %s", p.Since.UTC().Format(time.RFC3339), p.By)
	if p.Reason != "" {
		s += ": " + p.Reason
	}
	return s
}

// DB is what Set and Clear need of a connection, a pool or a
// transaction.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Lister is what List and a Watch need of a connection, a pool or a
// transaction.
type Lister interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

const (
	// setSQL pauses a source unless it is paused already, and returns the
	// pause in force either way.
	setSQL = `WITH added AS (
	INSERT INTO tidemark.source_pauses (source, paused_at, paused_by, reason) VALUES ($1, $2, $3, $4)
	ON CONFLICT (source) DO NOTHING
	RETURNING paused_at, paused_by, reason, true AS added
)
SELECT * FROM added
UNION ALL
SELECT paused_at, paused_by, reason, false FROM tidemark.source_pauses WHERE source = $1 AND NOT EXISTS (SELECT FROM added)`
	clearSQL = `DELETE FROM tidemark.source_pauses WHERE source = $1 RETURNING paused_at, paused_by, reason`
	listSQL  = `SELECT source, paused_at, paused_by, reason FROM tidemark.source_pauses ORDER BY source`
)

// Set pauses p.Source. It returns the pause in force and whether it is p:
// a source paused already keeps its first pause (its time, user and
// reason).
func Set(ctx context.Context, db DB, p Pause) (Pause, bool, error) {
	got := Pause{Source: p.Source}
	var added bool
	err := db.QueryRow(ctx, setSQL, p.Source, p.Since, p.By, p.Reason).Scan(&got.Since, &got.By, &got.Reason, &added)
	if err != nil {
		return Pause{}, false, fmt.Errorf("pause %s: %w", p.Source, err)
	}
	return got, added, nil
}

// Clear resumes source. It returns the pause it ended, and false when the
// source was not paused.
func Clear(ctx context.Context, db DB, source string) (Pause, bool, error) {
	p := Pause{Source: source}
	err := db.QueryRow(ctx, clearSQL, source).Scan(&p.Since, &p.By, &p.Reason)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Pause{}, false, nil
	case err != nil:
		return Pause{}, false, fmt.Errorf("resume %s: %w", source, err)
	}
	return p, true, nil
}

// List returns the paused sources, by name.
func List(ctx context.Context, db Lister) ([]Pause, error) {
	rows, err := db.Query(ctx, listSQL)
	if err != nil {
		return nil, fmt.Errorf("read paused sources: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Pause, error) {
		var p Pause
		err := row.Scan(&p.Source, &p.Since, &p.By, &p.Reason)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read paused sources: %w", err)
	}
	return out, nil
}
