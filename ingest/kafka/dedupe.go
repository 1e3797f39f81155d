package kafka

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// claimIDsSQL records a source's event ids as loaded at $2, in the order
// given, and returns those the batch is to load: ids not recorded yet and
// ids recorded before $4, the start of the source's dedupe window. An id
// another transaction has recorded but not committed makes this wait for
// it; once that commits the id is within the window and not returned.
const claimIDsSQL = `
INSERT INTO tidemark.event_ids AS e (source, event_id, loaded_at)
SELECT $1, u.id, $2 FROM unnest($3::text[]) AS u (id)
ON CONFLICT (source, event_id) DO UPDATE SET loaded_at = EXCLUDED.loaded_at
WHERE e.loaded_at < $4
RETURNING e.event_id`

// releaseIDsSQL removes ids a batch claimed for rows the warehouse then
// refused, so that a later event with the id loads.
const releaseIDsSQL = `DELETE FROM tidemark.event_ids WHERE source = $1 AND event_id = ANY($2::text[])`

// dedupeIDs drops the rows of sources with dedupe.by: event_id whose id was
// loaded within the source's window, or came earlier in rows, and records
// the ids of the rows it keeps as loaded at ingestedAt, in the batch
// transaction tx. It returns the rows to write and how many it dropped per
// source. Rows of other sources are kept. Ids are claimed sorted by
// source and id, so that writers that claim the same ids at once take
// their locks in one order and cannot deadlock.
func (w *writer) dedupeIDs(ctx context.Context, tx pgx.Tx, rows []*row, ingestedAt time.Time) ([]*row, map[*source]int, error) {
	// load[src][id] is whether the id is still to be loaded: set once the
	// claim returns it, cleared when its first row is kept.
	load := map[*source]map[string]bool{}
	for _, r := range rows {
		if r.src.dedupeWindow == 0 {
			continue
		}
		m := load[r.src]
		if m == nil {
			m = map[string]bool{}
			load[r.src] = m
		}
		m[r.ev.ID] = false
	}
	if len(load) == 0 {
		return rows, nil, nil
	}
	srcs := make([]*source, 0, len(load))
	for src := range load {
		srcs = append(srcs, src)
	}
	sort.Slice(srcs, func(i, j int) bool { return srcs[i].name < srcs[j].name })
	qb := &pgx.Batch{}
	for _, src := range srcs {
		ids := make([]string, 0, len(load[src]))
		for id := range load[src] {
			ids = append(ids, id)
		}
		sort.Strings(ids) // byte order: the column's collation "C"
		qb.Queue(claimIDsSQL, src.name, ingestedAt, ids, ingestedAt.Add(-src.dedupeWindow))
	}
	br := tx.SendBatch(ctx, qb)
	defer br.Close()
	for _, src := range srcs {
		if err := scanClaimed(br, load[src]); err != nil {
			return nil, nil, classifyRowError(fmt.Errorf("claim event ids of %s: %w", src.name, err), src)
		}
	}
	if err := br.Close(); err != nil {
		return nil, nil, fmt.Errorf("claim event ids: %w", err)
	}
	kept, dropped := rows[:0:0], map[*source]int{}
	for _, r := range rows {
		m := load[r.src]
		switch {
		case m == nil:
		case m[r.ev.ID]:
			m[r.ev.ID] = false
		default:
			dropped[r.src]++
			continue
		}
		kept = append(kept, r)
	}
	return kept, dropped, nil
}

// scanClaimed reads the ids one claim returned into load.
func scanClaimed(br pgx.BatchResults, load map[string]bool) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		load[id] = true
	}
	return rows.Err()
}

// releaseIDs removes the ids that dedupeIDs claimed for rows, which the
// warehouse refused: nothing with those ids was loaded.
func (w *writer) releaseIDs(ctx context.Context, tx pgx.Tx, refused []*row) error {
	ids := map[*source][]string{}
	for _, r := range refused {
		if r.src.dedupeWindow > 0 {
			ids[r.src] = append(ids[r.src], r.ev.ID)
		}
	}
	for src, list := range ids {
		if _, err := tx.Exec(ctx, releaseIDsSQL, src.name, list); err != nil {
			return fmt.Errorf("release event ids of %s: %w", src.name, err)
		}
	}
	return nil
}

// missing returns the rows of all that kept, a subsequence of it, lacks.
func missing(all, kept []*row) []*row {
	var out []*row
	for _, r := range all {
		if len(kept) > 0 && kept[0] == r {
			kept = kept[1:]
			continue
		}
		out = append(out, r)
	}
	return out
}

// repeats reports whether rows holds an (event_id, event_time) twice.
func repeats(rows []*row) bool {
	seen := make(map[eventKey]bool, len(rows))
	for _, r := range rows {
		k := eventKey{r.ev.ID, r.ev.Time.UnixMicro()}
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	return false
}
