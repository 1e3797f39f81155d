package aggregate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Registered is an aggregate the warehouse knows: one that has been
// prepared for reconciling, as the configuration that last prepared it
// defined it. Retention keeps what each needs, whether or not the
// configuration at hand names it.
type Registered struct {
	Name, Source string
	// Defined says Calendar, Horizon and Policy were recorded; an
	// aggregate registered before they were has only its name and source.
	Defined  bool
	Calendar Calendar
	Horizon  time.Duration
	Policy   string
	// DefinedAt is when a configuration last changed the definition.
	DefinedAt time.Time
}

const (
	// registrySQL reads the registered aggregates. The registry is the
	// aggregates' load watermark rows, which prepare creates.
	registrySQL = `
SELECT aggregate, source, partition_by, time_zone, extract(epoch FROM lateness_horizon)::float8, beyond_horizon, defined_at
FROM tidemark.load_watermarks ORDER BY aggregate`

	registeredSQL = `
SELECT partition_by, time_zone, extract(epoch FROM lateness_horizon)::float8, beyond_horizon, defined_at
FROM tidemark.load_watermarks WHERE aggregate = $1 FOR UPDATE`

	defineSQL = `
UPDATE tidemark.load_watermarks
SET partition_by = $2, time_zone = $3, lateness_horizon = make_interval(secs => $4), beyond_horizon = $5, defined_at = $6
WHERE aggregate = $1`

	// syncArchivedSQL archives the aggregate's partitions that start
	// before its source's retention bound, as retention does when it
	// raises the bound, for partitions it did not archive then.
	syncArchivedSQL = `
UPDATE tidemark.partitions SET state = 'archived', archived_at = $3, updated_at = $3
WHERE aggregate = $1 AND state <> 'archived'
  AND partition_start < (SELECT retained_from FROM tidemark.raw_retention WHERE source = $2)`
)

// Querier runs a query: a connection, a pool or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Registry lists the aggregates the warehouse knows (see Registered), by
// name.
func Registry(ctx context.Context, q Querier) ([]Registered, error) {
	rows, err := q.Query(ctx, registrySQL)
	if err != nil {
		return nil, fmt.Errorf("read the registered aggregates: %w", err)
	}
	var out []Registered
	var name, source string
	var by, zone, policy *string
	var horizon *float64
	var definedAt *time.Time
	_, err = pgx.ForEachRow(rows, []any{&name, &source, &by, &zone, &horizon, &policy, &definedAt}, func() error {
		r := Registered{Name: name, Source: source}
		if by != nil && zone != nil && horizon != nil && policy != nil {
			loc, err := time.LoadLocation(*zone)
			if err != nil {
				return fmt.Errorf("aggregate %s: recorded time zone %q: %w", name, *zone, err)
			}
			r.Defined, r.Calendar, r.Horizon, r.Policy = true, Calendar{By: *by, Loc: loc}, seconds(*horizon), *policy
		}
		if definedAt != nil {
			r.DefinedAt = *definedAt
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the registered aggregates: %w", err)
	}
	return out, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Register records d's definition (calendar, horizon, policy) in the
// registry, in tx, where prepare created its row, and returns the one it
// replaced when that differed (Defined false when none was recorded). It
// then archives d's partitions before its source's retention bound that
// are not archived yet: a warehouse pruned while d was not registered
// there, or before retention archived every registered aggregate, agrees
// with the bound again, as status and verify read it.
func Register(ctx context.Context, tx pgx.Tx, d *Definition, now time.Time) (Registered, bool, error) {
	prev := Registered{Name: d.Name, Source: d.Source}
	var by, zone, policy *string
	var horizon *float64
	var definedAt *time.Time
	err := tx.QueryRow(ctx, registeredSQL, d.Name).Scan(&by, &zone, &horizon, &policy, &definedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return prev, false, fmt.Errorf("register aggregate %s: it has no load watermark row", d.Name)
	}
	if err != nil {
		return prev, false, fmt.Errorf("register aggregate %s: %w", d.Name, err)
	}
	changed := true
	if by != nil && zone != nil && horizon != nil && policy != nil {
		prev.Defined, prev.Calendar.By, prev.Horizon, prev.Policy = true, *by, seconds(*horizon), *policy
		if loc, err := time.LoadLocation(*zone); err == nil {
			prev.Calendar.Loc = loc
		}
		if definedAt != nil {
			prev.DefinedAt = *definedAt
		}
		changed = *by != d.Calendar.By || *zone != d.Calendar.Loc.String() || prev.Horizon != d.Horizon || *policy != d.Policy
	}
	if changed {
		if _, err := tx.Exec(ctx, defineSQL, d.Name, d.Calendar.By, d.Calendar.Loc.String(), d.Horizon.Seconds(), d.Policy, now); err != nil {
			return prev, false, fmt.Errorf("register aggregate %s: %w", d.Name, err)
		}
	}
	if _, err := tx.Exec(ctx, syncArchivedSQL, d.Name, d.Source, now); err != nil {
		return prev, false, fmt.Errorf("register aggregate %s: archive partitions before the retention bound: %w", d.Name, err)
	}
	return prev, changed, nil
}

// ErrNotRegistered means the warehouse holds no state of an aggregate.
var ErrNotRegistered = errors.New("no aggregate of that name is registered")

// ErrReconciling means an instance is reconciling the aggregate now.
var ErrReconciling = errors.New("an instance is reconciling the aggregate")

// ReconcileLockKey names the session advisory lock held by the instance
// that claims an aggregate's new data.
func ReconcileLockKey(name string) string { return "tidemark.reconcile." + name }

// stateTables are the state tables holding rows of an aggregate, in the
// order Forget deletes them; tidemark.load_watermarks, its registration,
// goes last.
var stateTables = []struct{ table, where string }{
	{"tidemark.pending_partitions", "aggregate = $1"},
	{"tidemark.partitions", "aggregate = $1"},
	{"tidemark.partition_arrivals", "aggregate = $1"},
	{"tidemark.corrections", "aggregate = $1"},
	{"tidemark.shadow_builds", "aggregate = $1"},
	{"tidemark.backfill_runs", "aggregate = $1"}, // and their chunks, by cascade
	{"tidemark.verify_runs", "aggregate = $1"},
	{"tidemark.load_watermarks", "aggregate = $1"},
}

// Forgotten is what Forget removed (or would remove) from one table.
type Forgotten struct {
	Table string
	Rows  int64
}

// ForgetQuiet is how long an aggregate must not have been reconciled for
// Forget to remove its state: an instance whose configuration still names
// it reconciles it every reconcile.every.
const ForgetQuiet = time.Hour

// Forget removes the state of aggregate name from the warehouse, in tx:
// its registration, partitions, queue, arrival histories, corrections and
// run records, so that retention no longer keeps what it needed. Its
// table and shadow table are left as they are. With dryRun it only counts
// (tx is the caller's to roll back either way). It refuses an aggregate
// the warehouse does not know (ErrNotRegistered), and one an instance is
// reconciling now or reconciled less than ForgetQuiet before now
// (ErrReconciling); the caller checks that its own configuration does not
// name it.
func Forget(ctx context.Context, tx pgx.Tx, name string, now time.Time, dryRun bool) ([]Forgotten, error) {
	var lastRun *time.Time
	err := tx.QueryRow(ctx, `SELECT last_run_at FROM tidemark.load_watermarks WHERE aggregate = $1 FOR UPDATE`, name).Scan(&lastRun)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("forget %s: %w", name, ErrNotRegistered)
	}
	if err != nil {
		return nil, fmt.Errorf("forget %s: %w", name, err)
	}
	var free bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`, ReconcileLockKey(name)).Scan(&free); err != nil {
		return nil, fmt.Errorf("forget %s: %w", name, err)
	}
	switch {
	case !free:
		return nil, fmt.Errorf("forget %s: %w now: remove it from that instance's configuration first", name, ErrReconciling)
	case lastRun != nil && lastRun.After(now.Add(-ForgetQuiet)):
		return nil, fmt.Errorf("forget %s: %w: it was reconciled at %s, less than %s ago; remove it from every instance's configuration first",
			name, ErrReconciling, lastRun.UTC().Format(time.RFC3339), ForgetQuiet)
	}
	var out []Forgotten
	for _, s := range stateTables {
		sql := fmt.Sprintf("DELETE FROM %s WHERE %s", s.table, s.where)
		if dryRun {
			sql = fmt.Sprintf("SELECT count(*) FROM %s WHERE %s", s.table, s.where)
		}
		var n int64
		if dryRun {
			if err := tx.QueryRow(ctx, sql, name).Scan(&n); err != nil {
				return out, fmt.Errorf("forget %s: %s: %w", name, s.table, err)
			}
		} else {
			tag, err := tx.Exec(ctx, sql, name)
			if err != nil {
				return out, fmt.Errorf("forget %s: %s: %w", name, s.table, err)
			}
			n = tag.RowsAffected()
		}
		out = append(out, Forgotten{Table: s.table, Rows: n})
	}
	return out, nil
}
