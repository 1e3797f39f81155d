// Package migrate owns the warehouse schema of tidemark's own state: the
// versioned SQL migrations embedded in the binary and the migrator that
// applies them.
//
// Migrations are files named NNNN_description.sql under sql/. Each is
// applied in its own transaction and recorded, with a checksum, in
// tidemark.schema_migrations. The whole run holds a session advisory lock,
// so several tidemark processes starting at once apply each migration
// exactly once. A database that records a version this binary does not know
// is refused: an older binary must not run against a newer schema.
package migrate

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/connerr"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
)

//go:embed sql/*.sql
var files embed.FS

// LockKey is the advisory lock key held while migrating ("tidemark" as
// ASCII, truncated to 63 bits).
const LockKey int64 = 0x746964656d61726b

// Migration is one embedded schema change.
type Migration struct {
	Version  int
	Name     string
	SQL      string
	Checksum string
}

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		return nil, fmt.Errorf("migrate: read embedded migrations: %w", err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migrate: embedded file %s is not named NNNN_description.sql", name)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrate: version %d used by %s and %s", v, prev, name)
		}
		seen[v] = name
		body, err := files.ReadFile(path.Join("sql", name))
		if err != nil {
			return nil, fmt.Errorf("migrate: read %s: %w", name, err)
		}
		sum := sha256.Sum256(body)
		out = append(out, Migration{Version: v, Name: rest, SQL: string(body), Checksum: hex.EncodeToString(sum[:])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Result says what a run did.
type Result struct {
	Applied []Migration // applied by this run, in order
	Current int         // schema version after the run
}

const createVersionTable = `
CREATE SCHEMA IF NOT EXISTS tidemark;
CREATE TABLE IF NOT EXISTS tidemark.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

// Up applies every embedded migration the database does not have yet. It
// uses its own connection to dsn so the advisory lock is held by one session
// for the whole run.
func Up(ctx context.Context, dsn string, log *slog.Logger) (Result, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	all, err := All()
	if err != nil {
		return Result{}, err
	}
	cc, err := pgconnect.Parse(dsn, "tidemark-migrate")
	if err != nil {
		return Result{}, fmt.Errorf("migrate: warehouse.dsn: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		// Connecting is the first thing every command does with the
		// warehouse: the error names the key to fix, not this step.
		return Result{}, fmt.Errorf("warehouse.dsn: %w", connerr.Explain(err))
	}
	defer pgconnect.Close(ctx, conn)

	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", LockKey); err != nil {
		return Result{}, fmt.Errorf("migrate: take advisory lock: %w", err)
	}
	defer func() {
		cctx, cancel := pgconnect.Cleanup(ctx)
		defer cancel()
		_, _ = conn.Exec(cctx, "SELECT pg_advisory_unlock($1)", LockKey)
	}()

	if _, err := conn.Exec(ctx, createVersionTable); err != nil {
		return Result{}, fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, conn)
	if err != nil {
		return Result{}, err
	}
	known := map[int]Migration{}
	for _, m := range all {
		known[m.Version] = m
	}
	res := Result{}
	for v, sum := range applied {
		m, ok := known[v]
		if !ok {
			return res, fmt.Errorf("migrate: the database has schema version %d, which this tidemark binary does not know; run a newer binary", v)
		}
		if m.Checksum != sum {
			log.Warn("migration changed since it was applied", "version", v, "name", m.Name)
		}
		if v > res.Current {
			res.Current = v
		}
	}
	for _, m := range all {
		if _, done := applied[m.Version]; done {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO tidemark.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
				m.Version, m.Name, m.Checksum)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("migrate: apply %04d_%s: %w", m.Version, m.Name, err)
		}
		log.Info("applied migration", "version", m.Version, "name", m.Name)
		res.Applied = append(res.Applied, m)
		res.Current = m.Version
	}
	return res, nil
}

// Version returns the highest applied version, 0 when none (also when the
// database has never been migrated).
func Version(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int, error) {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('tidemark.schema_migrations') IS NOT NULL").Scan(&exists); err != nil {
		// The first query of a command that does not migrate, on a
		// pool that connects only now.
		if pgerr.ConnectFailure(err) {
			return 0, fmt.Errorf("warehouse.dsn: %w", connerr.Explain(err))
		}
		return 0, fmt.Errorf("migrate: read schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM tidemark.schema_migrations").Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("migrate: read schema version: %w", err)
	}
	return v, nil
}

// Latest returns the highest embedded version.
func Latest() int {
	all, err := All()
	if err != nil || len(all) == 0 {
		return 0
	}
	return all[len(all)-1].Version
}

func appliedVersions(ctx context.Context, conn *pgx.Conn) (map[int]string, error) {
	rows, err := conn.Query(ctx, "SELECT version, checksum FROM tidemark.schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("migrate: read schema_migrations: %w", err)
	}
	out := map[int]string{}
	for rows.Next() {
		var v int
		var sum string
		if err := rows.Scan(&v, &sum); err != nil {
			return nil, fmt.Errorf("migrate: read schema_migrations: %w", err)
		}
		out[v] = sum
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrate: read schema_migrations: %w", err)
	}
	return out, nil
}

// ErrBehind is returned by Check when the database needs migrations.
var ErrBehind = errors.New("migrate: warehouse schema is behind this binary; run tidemark migrate")

// Check verifies that the database is at the latest embedded version.
func Check(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	v, err := Version(ctx, q)
	if err != nil {
		return err
	}
	if v < Latest() {
		return fmt.Errorf("%w (database at %d, binary at %d)", ErrBehind, v, Latest())
	}
	return nil
}
