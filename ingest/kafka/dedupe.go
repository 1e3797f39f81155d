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

// idKey is an event id of a source.
type idKey struct {
	src *source
	id  string
}

// idClaims are the event ids a batch claimed, per source with dedupe.by:
// event_id: true for an id the batch is to load, false for an id loaded
// within the source's window (its rows are duplicates).
type idClaims map[*source]map[string]bool

// ours reports whether the batch is to load id.
func (c idClaims) ours(id idKey) bool { return c[id.src][id.id] }

// claimIDs claims the ids of the rows of sources with dedupe.by: event_id
// (each of rowSets) as loaded at ingestedAt, in the batch transaction tx.
// Ids are claimed sorted by source and id, all in one round trip, so that
// writers that claim the same ids at once take their locks in one order
// and cannot deadlock.
func (w *writer) claimIDs(ctx context.Context, tx pgx.Tx, ingestedAt time.Time, rowSets ...[]*row) (idClaims, error) {
	claims := idClaims{}
	for _, rows := range rowSets {
		for _, r := range rows {
			if r.src.dedupeWindow == 0 {
				continue
			}
			m := claims[r.src]
			if m == nil {
				m = map[string]bool{}
				claims[r.src] = m
			}
			m[r.ev.ID] = false
		}
	}
	if len(claims) == 0 {
		return claims, nil
	}
	srcs := make([]*source, 0, len(claims))
	for src := range claims {
		srcs = append(srcs, src)
	}
	sort.Slice(srcs, func(i, j int) bool { return srcs[i].name < srcs[j].name })
	qb := &pgx.Batch{}
	for _, src := range srcs {
		list := make([]string, 0, len(claims[src]))
		for id := range claims[src] {
			list = append(list, id)
		}
		sort.Strings(list) // byte order: the column's collation "C"
		qb.Queue(claimIDsSQL, src.name, ingestedAt, list, ingestedAt.Add(-src.dedupeWindow))
	}
	br := tx.SendBatch(ctx, qb)
	defer br.Close()
	for _, src := range srcs {
		if err := scanClaimed(br, claims[src]); err != nil {
			return nil, classifyRowError(fmt.Errorf("claim event ids of %s: %w", src.name, err), src)
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("claim event ids: %w", err)
	}
	return claims, nil
}

// keep returns the rows to write of rows, each of which is written unless
// the warehouse refuses the whole write: rows of other sources, and the
// first row of each id the batch claimed; and how many it dropped per
// source (ids loaded within the window, or repeated). It takes from c
// each id it keeps: rows of one source are either kept here or checked
// one by one (insertCheckingRows), never both.
func (c idClaims) keep(rows []*row) ([]*row, map[*source]int) {
	if len(c) == 0 {
		return rows, nil
	}
	kept, dropped := rows[:0:0], map[*source]int{}
	for _, r := range rows {
		if m := c[r.src]; m != nil {
			if !m[r.ev.ID] {
				dropped[r.src]++
				continue
			}
			m[r.ev.ID] = false
		}
		kept = append(kept, r)
	}
	return kept, dropped
}

// unused returns the ids of rows that the batch claimed and stored none
// of, each once: they are released.
func (c idClaims) unused(rows []*row, stored map[idKey]bool) []idKey {
	var out []idKey
	seen := map[idKey]bool{}
	for _, r := range rows {
		k := idKey{r.src, r.ev.ID}
		if r.src.dedupeWindow > 0 && c.ours(k) && !stored[k] && !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// dedupeIDs drops the rows of sources with dedupe.by: event_id whose id was
// loaded within the source's window, or came earlier in rows, and records
// the ids of the rows it keeps as loaded at ingestedAt, in the batch
// transaction tx (claimIDs, then keep). It returns the rows to write and
// how many it dropped per source. Rows of other sources are kept.
func (w *writer) dedupeIDs(ctx context.Context, tx pgx.Tx, rows []*row, ingestedAt time.Time) ([]*row, map[*source]int, error) {
	claims, err := w.claimIDs(ctx, tx, ingestedAt, rows)
	if err != nil {
		return nil, nil, err
	}
	kept, dropped := claims.keep(rows)
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

// releaseIDs removes ids that a batch claimed and stored no row of (the
// warehouse refused each): nothing with those ids was loaded.
func (w *writer) releaseIDs(ctx context.Context, tx pgx.Tx, ids []idKey) error {
	bySource := map[*source][]string{}
	for _, k := range ids {
		bySource[k.src] = append(bySource[k.src], k.id)
	}
	for src, list := range bySource {
		if _, err := tx.Exec(ctx, releaseIDsSQL, src.name, list); err != nil {
			return forSource(src, fmt.Errorf("release event ids of %s: %w", src.name, err))
		}
	}
	return nil
}

// repeats reports whether rows holds an event twice.
func repeats(rows []*row) bool {
	seen := make(map[eventKey]bool, len(rows))
	for _, r := range rows {
		k := keyOf(r)
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	return false
}
