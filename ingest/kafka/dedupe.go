package kafka

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgerr"
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

// eventIDsTable and eventIDsColumns are what copyIDs copies ids into.
var (
	eventIDsTable   = pgx.Identifier{"tidemark", "event_ids"}
	eventIDsColumns = []string{"source", "event_id", "loaded_at"}
)

// idKey is an event id of a source.
type idKey struct {
	src *source
	id  string
}

// idClaims are the event ids a batch claimed, per source with dedupe.by:
// event_id.
type idClaims map[*source]*srcClaims

// srcClaims are the ids a batch claimed of one source. The batch is to
// load each of the ids claimed, and no other: an id loaded within the
// source's window is a duplicate's.
type srcClaims struct {
	// all: every id of the source's rows was claimed (copyIDs); load is
	// then nil.
	all bool
	// load holds, unless all, the ids the batch is to load.
	load map[string]bool
	// repeats: an id comes twice among the source's rows.
	repeats bool
	// taken holds, when all, the ids keep kept a row of, while spent says
	// keep kept a row of every id (the source had no repeats).
	taken map[string]bool
	spent bool
}

// ours reports whether the batch is to load id (and keep has not kept a
// row of it).
func (c idClaims) ours(id idKey) bool {
	s := c[id.src]
	switch {
	case s == nil:
		return false
	case s.all:
		return !s.spent && !s.taken[id.id]
	default:
		return s.load[id.id]
	}
}

// take records that keep kept a row of id: ours no longer reports it.
func (c idClaims) take(id idKey) {
	s := c[id.src]
	switch {
	case !s.all:
		s.load[id.id] = false
	case s.repeats:
		if s.taken == nil {
			s.taken = map[string]bool{}
		}
		s.taken[id.id] = true
	}
}

// sortedIDs are the ids of one source to claim, each once, in byte order
// (the column's collation "C").
type sortedIDs struct {
	src *source
	ids []string
}

// collectIDs lists, per source with dedupe.by: event_id, the ids of the
// rows of rowSets, sorted by source and id, and returns the claims to
// fill, one per source, with whether its ids repeat.
func collectIDs(rowSets [][]*row) ([]sortedIDs, idClaims) {
	bySrc := map[*source][]string{}
	for _, rows := range rowSets {
		for _, r := range rows {
			if r.src.dedupeWindow > 0 {
				bySrc[r.src] = append(bySrc[r.src], r.ev.ID)
			}
		}
	}
	claims := make(idClaims, len(bySrc))
	sets := make([]sortedIDs, 0, len(bySrc))
	for src, ids := range bySrc {
		slices.Sort(ids)
		n := len(ids)
		ids = slices.Compact(ids)
		claims[src] = &srcClaims{repeats: len(ids) < n}
		sets = append(sets, sortedIDs{src, ids})
	}
	sort.Slice(sets, func(i, j int) bool { return sets[i].src.name < sets[j].src.name })
	return sets, claims
}

// claimIDs claims the ids of the rows of sources with dedupe.by: event_id
// (each of rowSets) as loaded at ingestedAt, in the batch transaction tx.
// Ids are claimed sorted by source and id, so that writers that claim the
// same ids at once take their locks in one order and cannot deadlock.
//
// Most ids are new: they are copied into tidemark.event_ids (copyIDs),
// which costs the warehouse less than half of claiming them one by one
// (INSERT ... ON CONFLICT, about 5 us of CPU per id). When one of
// them is there already (a duplicate, or an id loaded longer ago than the
// window that retention has not removed yet), the copy fails and is
// rolled back, and the ids are claimed one by one (claimEach), as are the
// ids of the next probeAfterDuplicate batches of the writer: duplicates
// cost one failed copy per probeAfterDuplicate batches. Either way the
// primary key of tidemark.event_ids decides, in tx.
func (w *writer) claimIDs(ctx context.Context, tx pgx.Tx, ingestedAt time.Time, rowSets ...[]*row) (idClaims, error) {
	sets, claims := collectIDs(rowSets)
	if len(sets) == 0 {
		return claims, nil
	}
	if w.claimLeft > 0 {
		w.claimLeft--
	} else {
		copied, err := copyIDs(ctx, tx, ingestedAt, sets)
		if err != nil {
			return nil, err
		}
		if copied {
			for _, s := range claims {
				s.all = true
			}
			return claims, nil
		}
		w.claimLeft = probeAfterDuplicate
	}
	if err := claimEach(ctx, tx, ingestedAt, sets, claims); err != nil {
		return nil, err
	}
	return claims, nil
}

// copyIDs copies the ids of sets, loaded at ingestedAt, into
// tidemark.event_ids under a savepoint of tx, in one COPY. It reports
// false, the savepoint rolled back, when the warehouse refused the copy:
// on an id recorded before (another transaction's that is still open is
// waited for, as by claimEach), or for any other reason, which claimEach
// then meets and attributes to its source.
func copyIDs(ctx context.Context, tx pgx.Tx, ingestedAt time.Time, sets []sortedIDs) (bool, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("claim event ids: %w", err)
	}
	set, next, row := 0, 0, make([]any, 3)
	src := pgx.CopyFromFunc(func() ([]any, error) {
		for set < len(sets) && next == len(sets[set].ids) {
			set, next = set+1, 0
		}
		if set == len(sets) {
			return nil, nil
		}
		row[0], row[1], row[2] = sets[set].src.name, sets[set].ids[next], ingestedAt
		next++
		return row, nil
	})
	if _, err := sp.CopyFrom(ctx, eventIDsTable, eventIDsColumns, src); err != nil {
		if pgerr.Code(err) == "" || pgerr.Unavailable(err) {
			return false, fmt.Errorf("copy event ids: %w", err)
		}
		if err := sp.Rollback(ctx); err != nil {
			return false, fmt.Errorf("copy event ids: %w", err)
		}
		return false, nil
	}
	if err := sp.Commit(ctx); err != nil {
		return false, fmt.Errorf("copy event ids: %w", err)
	}
	return true, nil
}

// claimEach claims the ids of sets one by one (claimIDsSQL), all in one
// round trip, and records in claims those the batch is to load.
func claimEach(ctx context.Context, tx pgx.Tx, ingestedAt time.Time, sets []sortedIDs, claims idClaims) error {
	qb := &pgx.Batch{}
	for _, set := range sets {
		qb.Queue(claimIDsSQL, set.src.name, ingestedAt, set.ids, ingestedAt.Add(-set.src.dedupeWindow))
	}
	br := tx.SendBatch(ctx, qb)
	defer br.Close()
	for _, set := range sets {
		load := map[string]bool{}
		if err := scanClaimed(br, load); err != nil {
			return classifyRowError(fmt.Errorf("claim event ids of %s: %w", set.src.name, err), set.src)
		}
		claims[set.src].load = load
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("claim event ids: %w", err)
	}
	return nil
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
		s := c[r.src]
		switch {
		case s == nil:
		case s.all && !s.repeats:
			// Every id is claimed, each comes once: every row is kept,
			// and every id taken.
			s.spent = true
		case !c.ours(idKey{r.src, r.ev.ID}):
			dropped[r.src]++
			continue
		default:
			c.take(idKey{r.src, r.ev.ID})
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
