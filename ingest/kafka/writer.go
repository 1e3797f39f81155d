package kafka

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/citus"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/raw"
)

// probeRawSQL finds which of a batch's event ids one raw partition already
// holds; %s is the quoted partition. The primary key (event_id, event_time)
// serves the lookup.
const probeRawSQL = `SELECT event_id, event_time FROM %s WHERE event_id = ANY($1::text[])`

// claimOffsetsSQL makes sure each partition of the batch has an offsets row
// (so that it can be locked), in a fixed order to avoid deadlocks between
// ingesters.
const claimOffsetsSQL = `
INSERT INTO tidemark.kafka_offsets (consumer_group, topic, partition, source, next_offset)
SELECT $1, u.topic, u.partition, u.source, -1
FROM unnest($2::text[], $3::integer[], $4::text[]) AS u (topic, partition, source)
ORDER BY u.topic, u.partition
ON CONFLICT DO NOTHING`

// currentXactSQL reads the id of the batch transaction. It is a statement
// of its own so that on Citus the coordinator answers it, whose
// transaction decides the outcome.
const currentXactSQL = `SELECT pg_current_xact_id()::text`

// lockOffsetsSQL locks the batch's offsets rows and reads what is stored.
// A stored position other than the one this ingester last wrote means
// another member of the group has written the partition since: the
// batch's records for it are stale and are dropped (fencing).
const lockOffsetsSQL = `
SELECT topic, partition, next_offset, leader_epoch
FROM tidemark.kafka_offsets
WHERE consumer_group = $1
  AND (topic, partition) IN (SELECT * FROM unnest($2::text[], $3::integer[]))
ORDER BY topic, partition
FOR UPDATE`

var deadLetterColumns = []string{"source", "reason", "detail", "topic", "partition", "offset", "record_key",
	"record_value", "header_keys", "header_values", "record_timestamp", "ingested_at"}

// updateOffsetsSQL stores the next positions and per-partition totals.
const updateOffsetsSQL = `
UPDATE tidemark.kafka_offsets AS o SET
    next_offset    = u.next_offset,
    leader_epoch   = u.leader_epoch,
    source         = u.source,
    max_event_time = greatest(o.max_event_time, u.max_event_time),
    last_event_at  = CASE WHEN u.max_event_time IS NULL THEN o.last_event_at ELSE $2 END,
    records        = o.records + u.records,
    rows_written   = o.rows_written + u.rows_written,
    duplicates     = o.duplicates + u.duplicates,
    dead_letters   = o.dead_letters + u.dead_letters,
    updated_at     = $2
FROM unnest($3::text[], $4::integer[], $5::text[], $6::bigint[], $7::integer[], $8::timestamptz[],
            $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[])
     AS u (topic, partition, source, next_offset, leader_epoch, max_event_time, records, rows_written, duplicates, dead_letters)
WHERE o.consumer_group = $1 AND o.topic = u.topic AND o.partition = u.partition`

// writeResult is what one batch write did.
type writeResult struct {
	// conflicts holds the stored positions of partitions whose records
	// were dropped because another ingester had advanced them. It is
	// filled as soon as the offsets are locked, so it is valid even when
	// the write then fails.
	conflicts map[topicPartition]position
	// inserted counts new raw rows per partition; the rest of each
	// partition's good records were duplicates.
	inserted map[topicPartition]int
	// rejected are rows the warehouse refused, stored as dead letters by
	// this write (only when rows were checked one by one).
	rejected []deadLetter
	// committed is false when nothing was left to write.
	committed bool
	// xid is the batch transaction's id (pg_current_xact_id), by which
	// the outcome of a commit whose answer was lost is asked for.
	xid string
	// idDuplicates counts, per source with dedupe.by: event_id, the rows
	// dropped because their id was loaded within the window or came
	// earlier in the batch; they are among the duplicates too.
	idDuplicates map[*source]int
}

// writer writes batches on one dedicated connection.
type writer struct {
	group string
	conn  *pgx.Conn
	// probeLeft is how many more batches look for stored events before
	// their COPY. It is zero until a COPY fails on an event stored before
	// (a duplicate from the producer or a replay), then
	// probeAfterDuplicate; a batch with no stored events thus costs no
	// probe, and a source that resends events pays one failed COPY per
	// probeAfterDuplicate batches.
	probeLeft int
	// dedupeLeft is the same for events a batch holds twice: how many more
	// batches drop their repeats before the COPY, after a COPY failed on
	// one.
	dedupeLeft int
	// claimLeft is the same for event ids (claimIDs): how many more
	// batches claim their ids one by one, after a COPY of ids failed on
	// one recorded before.
	claimLeft int
	// rawBinary records, per source, whether its raw table has the column
	// types that rawCopy encodes.
	rawBinary map[*source]bool
	// distributed records, per source, whether its raw table is a Citus
	// distributed table.
	distributed map[*source]bool
}

// probeAfterDuplicate is how many batches probe for stored events, or drop
// repeats within the batch, after a COPY failed on one.
const probeAfterDuplicate = 100

// errBadRow means the warehouse rejected the content of some row; the batch
// is retried with each row checked on its own.
var errBadRow = errors.New("the warehouse rejected a row")

// errRetryNow means a conflict with a concurrent transaction: another
// transaction stored one of the batch's events after the batch looked for
// it (a retry finds it stored), or a serialization failure or deadlock.
var errRetryNow = errors.New("conflict with a concurrent transaction")

// errCommitUnknown means the answer to the batch's COMMIT was lost (the
// connection broke or the attempt's deadline passed): the batch may be
// stored or not. The result's xid names the transaction, whose outcome
// the warehouse keeps (committedTxn).
var errCommitUnknown = errors.New("the batch's commit was sent and its answer lost")

// errStoredBefore wraps errRetryNow when a COPY that did not probe failed
// on an event stored before: the retry probes, finds it and counts it as a
// duplicate. It is not a write error.
var errStoredBefore = errors.New("the batch holds an event stored before")

// write runs one attempt of the batch transaction. expected holds the
// positions this ingester believes are stored. The rows of the sources in
// check are inserted one at a time, and those the warehouse refuses become
// dead letters (reported in the result; the batch is not changed); the
// other sources' rows are copied. The batch loses only the records of
// fenced partitions, which are stale whatever becomes of the attempt. A
// failed step of one source's part is attributed to it (sourceError).
func (w *writer) write(ctx context.Context, b *batch, expected map[topicPartition]position, ingestedAt time.Time, check map[*source]bool) (writeResult, error) {
	res := writeResult{conflicts: map[topicPartition]position{}, inserted: map[topicPartition]int{}}
	if err := w.ensurePartitions(ctx, b); err != nil {
		return res, err
	}
	if err := w.ensureMirrors(ctx, b); err != nil {
		return res, err
	}
	checkRows := len(check) > 0
	probe := checkRows || w.probeLeft > 0
	var inRaw map[eventKey]bool
	if probe {
		// Probed before the transaction: on Citus, a COPY over the
		// connections that read the same shards earlier in its
		// transaction is committed on the workers without two-phase
		// commit. Under READ COMMITTED the probe sees no less here: an
		// event stored meanwhile fails the COPY on the primary key, and
		// the batch is retried.
		var err error
		if inRaw, err = probeStored(ctx, w.conn, firstOfEach(rowsOf(b))); err != nil {
			return res, err
		}
	}
	tx, err := w.conn.Begin(ctx)
	if err != nil {
		return res, err
	}
	defer pgconnect.Rollback(ctx, tx)

	stored, xid, err := w.lockOffsets(ctx, tx, b)
	if err != nil {
		return res, err
	}
	res.xid = xid
	stale := map[topicPartition]bool{}
	for tp := range b.parts {
		exp, ok := expected[tp]
		if !ok {
			exp = noPosition
		}
		cur, ok := stored[tp]
		if !ok {
			cur = noPosition
		}
		if cur.Offset != exp.Offset {
			stale[tp] = true
			res.conflicts[tp] = cur
		}
	}
	b.drop(stale)
	if b.empty() {
		return res, nil
	}

	dedupe := probe || w.dedupeLeft > 0
	switch {
	case checkRows:
	case w.probeLeft > 0:
		w.probeLeft--
	case w.dedupeLeft > 0:
		w.dedupeLeft--
	}
	// The rows of sources checked one by one keep every copy of an event
	// not stored yet: a copy the warehouse refuses leaves the next to be
	// stored.
	copied, checked := splitChecked(rowsOf(b), check)
	copied, checked = newRows(copied, dedupe, probe, inRaw), notStored(checked, inRaw)
	claims, err := w.claimIDs(ctx, tx, ingestedAt, copied, checked)
	if err != nil {
		return res, err
	}
	copied, res.idDuplicates = claims.keep(copied)
	var rejected []deadLetter
	if checkRows {
		if checked, rejected, err = w.insertChecking(ctx, tx, b, checked, claims, inRaw, ingestedAt, check, &res); err != nil {
			return res, err
		}
	}
	if err := w.copyRows(ctx, tx, copied, ingestedAt); err != nil {
		if !probe && errors.Is(err, errRetryNow) && pgerr.UniqueViolation(err) {
			if !dedupe && repeats(copied) {
				w.dedupeLeft = probeAfterDuplicate
			} else {
				w.probeLeft = probeAfterDuplicate
			}
			err = fmt.Errorf("%w: %w", errStoredBefore, err)
		}
		return res, err
	}
	if err := w.applyMirrors(ctx, tx, b, ingestedAt, check); err != nil {
		return res, err
	}
	inserted, ledger := written(b, append(copied, checked...))
	if err := w.copyDeadLetters(ctx, tx, append(append([]deadLetter(nil), b.dead...), rejected...), ingestedAt); err != nil {
		return res, err
	}
	if err := w.storeLedgerAndOffsets(ctx, tx, b, ledger, ingestedAt, inserted, rejected); err != nil {
		return res, err
	}
	if err := tx.Commit(ctx); err != nil {
		if pgerr.Code(err) == "" { // not the server's refusal: the answer was lost
			res.inserted, res.rejected = inserted, rejected
			return res, fmt.Errorf("%w: %w", errCommitUnknown, err)
		}
		return res, err
	}
	res.inserted, res.rejected, res.committed = inserted, rejected, true
	return res, nil
}

// insertChecking writes, one at a time, rows (the rows of the sources in
// check not stored yet, every copy of an event) and the changes of those
// of them that are Debezium sources, with their mirror changes. It
// returns the rows stored and the rows refused, as dead letters, and adds
// the id duplicates it found to res.
func (w *writer) insertChecking(ctx context.Context, tx pgx.Tx, b *batch, rows []*row, claims idClaims, inRaw map[eventKey]bool,
	ingestedAt time.Time, check map[*source]bool, res *writeResult) ([]*row, []deadLetter, error) {
	kept, refused, idDups, err := w.insertCheckingRows(ctx, tx, rows, claims, ingestedAt)
	if err != nil {
		return nil, nil, err
	}
	changes, refusedChanges, err := w.insertCheckingChanges(ctx, tx, b, inRaw, ingestedAt, check)
	if err != nil {
		return nil, nil, err
	}
	for src, n := range idDups {
		if res.idDuplicates == nil {
			res.idDuplicates = map[*source]int{}
		}
		res.idDuplicates[src] += n
	}
	return append(kept, changes...), append(refused, refusedChanges...), nil
}

// commitStatusSQL reads the outcome of a transaction of this server:
// committed, aborted, in progress, or NULL once too old to be known.
const commitStatusSQL = `SELECT pg_xact_status($1::xid8)`

// commitStatusPoll is how often committedTxn asks again while the
// transaction is in progress.
const commitStatusPoll = 20 * time.Millisecond

// committedTxn reports, asking on conn, whether the transaction xid
// committed. While it is in progress (a server still finishing the COMMIT
// whose answer was lost, or not yet aware that its client is gone) it asks
// again until ctx ends. On Citus the coordinator's transaction decides:
// the workers' prepared parts follow its outcome.
func committedTxn(ctx context.Context, conn *pgx.Conn, xid string) (bool, error) {
	for {
		var status *string
		if err := conn.QueryRow(ctx, commitStatusSQL, xid).Scan(&status); err != nil {
			return false, fmt.Errorf("status of transaction %s: %w", xid, err)
		}
		switch {
		case status == nil:
			return false, fmt.Errorf("transaction %s is too old for its status to be known", xid)
		case *status == "committed":
			return true, nil
		case *status == "aborted":
			return false, nil
		}
		if err := backoff.Sleep(ctx, commitStatusPoll); err != nil {
			return false, fmt.Errorf("transaction %s still in progress: %w", xid, err)
		}
	}
}

// prepare creates the raw table of src and reads its mirror, once: a
// source the warehouse refused at the start is prepared by its writes.
func (w *writer) prepare(ctx context.Context, src *source) error {
	if src.prepared {
		return nil
	}
	if err := src.raw.Ensure(ctx, w.conn); err != nil {
		return err
	}
	if src.mirror != nil {
		if err := src.mirror.readTable(ctx, w.conn, src.raw.Ident()); err != nil {
			return err
		}
		// A mirror that does not exist yet is created from the first
		// change that declares its columns.
		if exists, err := src.mirror.load(ctx, w.conn); err != nil {
			return fmt.Errorf("source %s: the mirror (sources.%s.mirror.table): %w", src.name, src.name, err)
		} else if exists {
			_, key := src.mirror.known()
			src.dec.SetMirrorKey(key)
		}
	}
	src.prepared = true
	return nil
}

// ensurePartitions creates the raw partitions the batch's rows need.
// Partitions begin on a UTC hour, so the start of each of a source's hours
// in the batch's ledger stands for the rows in it.
func (w *writer) ensurePartitions(ctx context.Context, b *batch) error {
	done := map[*source]bool{}
	for _, pb := range b.parts {
		src := pb.source
		if done[src] {
			continue
		}
		done[src] = true
		if err := w.prepare(ctx, src); err != nil {
			return forSource(src, err)
		}
		if err := src.raw.EnsurePartitions(ctx, w.conn, src.raw.Missing(b.ledger.Hours(src.name))); err != nil {
			return forSource(src, err)
		}
	}
	return nil
}

func sortedParts(b *batch) []topicPartition {
	tps := make([]topicPartition, 0, len(b.parts))
	for tp := range b.parts {
		tps = append(tps, tp)
	}
	sort.Slice(tps, func(i, j int) bool {
		if tps[i].Topic != tps[j].Topic {
			return tps[i].Topic < tps[j].Topic
		}
		return tps[i].Partition < tps[j].Partition
	})
	return tps
}

func (w *writer) lockOffsets(ctx context.Context, tx pgx.Tx, b *batch) (map[topicPartition]position, string, error) {
	tps := sortedParts(b)
	topics := make([]string, len(tps))
	parts := make([]int32, len(tps))
	sources := make([]string, len(tps))
	for i, tp := range tps {
		topics[i], parts[i], sources[i] = tp.Topic, tp.Partition, b.parts[tp].source.name
	}
	qb := &pgx.Batch{}
	qb.Queue(claimOffsetsSQL, w.group, topics, parts, sources)
	qb.Queue(lockOffsetsSQL, w.group, topics, parts)
	qb.Queue(currentXactSQL)
	br := tx.SendBatch(ctx, qb)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, "", fmt.Errorf("claim offsets: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, "", fmt.Errorf("lock offsets: %w", err)
	}
	stored := map[topicPartition]position{}
	for rows.Next() {
		var tp topicPartition
		var p position
		if err := rows.Scan(&tp.Topic, &tp.Partition, &p.Offset, &p.Epoch); err != nil {
			return nil, "", fmt.Errorf("lock offsets: %w", err)
		}
		stored[tp] = p
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("lock offsets: %w", err)
	}
	var xid string
	if err := br.QueryRow().Scan(&xid); err != nil {
		return nil, "", fmt.Errorf("transaction id: %w", err)
	}
	return stored, xid, br.Close()
}

// eventKey identifies an event of a source: (event_id, event_time).
type eventKey struct {
	src *source
	id  string
	us  int64 // event time in unix microseconds
}

// keyOf is the event r holds.
func keyOf(r *row) eventKey { return eventKey{r.src, r.ev.ID, r.ev.Time.UnixMicro()} }

// rowsOf returns pointers to the rows of b, in order.
func rowsOf(b *batch) []*row {
	rows := make([]*row, len(b.rows))
	for i := range b.rows {
		rows[i] = &b.rows[i]
	}
	return rows
}

// newRows returns the rows to COPY: every row, or with dedupe the first of
// each event (source, event_id, event_time), and with probe (which implies
// dedupe) minus those in stored, which probeStored found in the raw
// partitions. Rows neither step removed fail the COPY on the primary key,
// and the batch is retried with the step it lacked.
func newRows(rows []*row, dedupe, probe bool, stored map[eventKey]bool) []*row {
	if !dedupe && !probe {
		return rows
	}
	fresh := firstOfEach(rows)
	if !probe || len(stored) == 0 {
		return fresh
	}
	return notStored(fresh, stored)
}

// notStored returns the rows whose event is not in stored.
func notStored(rows []*row, stored map[eventKey]bool) []*row {
	if len(stored) == 0 {
		return rows
	}
	kept := make([]*row, 0, len(rows))
	for _, r := range rows {
		if !stored[keyOf(r)] {
			kept = append(kept, r)
		}
	}
	return kept
}

// batchSender is a connection or a transaction, for queries sent in a
// batch.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// probeStored returns which of the events of rows a raw partition holds.
func probeStored(ctx context.Context, q batchSender, rows []*row) (map[eventKey]bool, error) {
	type part struct {
		src   *source
		start time.Time
	}
	ids := map[part][]string{}
	for _, r := range rows {
		p := part{r.src, r.src.raw.PartitionStart(r.ev.Time)}
		ids[p] = append(ids[p], r.ev.ID)
	}
	stored := map[eventKey]bool{}
	if len(ids) == 0 {
		return stored, nil
	}
	qb := &pgx.Batch{}
	order := make([]part, 0, len(ids))
	for p, list := range ids {
		order = append(order, p)
		name := pgquote.Ident(raw.Schema, p.src.raw.PartitionName(p.start))
		qb.Queue(fmt.Sprintf(probeRawSQL, name), list)
	}
	br := q.SendBatch(ctx, qb)
	defer br.Close()
	for _, p := range order {
		rows, err := br.Query()
		if err != nil {
			return nil, classifyRowError(fmt.Errorf("probe raw partitions: %w", err), p.src)
		}
		for rows.Next() {
			var id string
			var t time.Time
			if err := rows.Scan(&id, &t); err != nil {
				rows.Close()
				return nil, fmt.Errorf("probe raw partitions: %w", err)
			}
			stored[eventKey{p.src, id, t.UnixMicro()}] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("probe raw partitions: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("probe raw partitions: %w", err)
	}
	return stored, nil
}

// firstOfEach returns the first row of each event among rows.
func firstOfEach(rows []*row) []*row {
	seen := make(map[eventKey]bool, len(rows))
	fresh := make([]*row, 0, len(rows))
	for _, r := range rows {
		k := keyOf(r)
		if !seen[k] {
			seen[k] = true
			fresh = append(fresh, r)
		}
	}
	return fresh
}

// splitChecked splits rows into those of sources not in check, to be
// copied, and those of sources in check, to be inserted one at a time;
// each keeps the order of rows.
func splitChecked(rows []*row, check map[*source]bool) (copied, checked []*row) {
	if len(check) == 0 {
		return rows, nil
	}
	for _, r := range rows {
		if check[r.src] {
			checked = append(checked, r)
		} else {
			copied = append(copied, r)
		}
	}
	return copied, checked
}

// copyRows writes the new rows into their raw tables with COPY.
func (w *writer) copyRows(ctx context.Context, tx pgx.Tx, fresh []*row, ingestedAt time.Time) error {
	if len(fresh) == 0 {
		return nil
	}
	bySource := map[*source][]*row{}
	if oneSource(fresh) {
		bySource[fresh[0].src] = fresh
	} else {
		for _, r := range fresh {
			bySource[r.src] = append(bySource[r.src], r)
		}
	}
	for src, rows := range bySource {
		if err := w.copySource(ctx, tx, src, rows, ingestedAt); err != nil {
			err = fmt.Errorf("copy into %s: %w", src.raw.Ident(), err)
			if pgerr.Relayed(err) {
				// A worker refused a row and the coordinator did not say
				// why: the rows are checked one by one, whose refusals
				// carry their SQLSTATE.
				return forSource(src, fmt.Errorf("%w: %w", errBadRow, err))
			}
			return classifyRowError(err, src)
		}
	}
	return nil
}

// oneSource reports whether rows are all of one source, the common case
// that needs no grouping.
func oneSource(rows []*row) bool {
	for _, r := range rows {
		if r.src != rows[0].src {
			return false
		}
	}
	return len(rows) > 0
}

// copySource copies rows into the raw table of src: encoded here when the
// table has the column types tidemark creates it with (looked up once per
// connection), through pgx's CopyFrom otherwise.
func (w *writer) copySource(ctx context.Context, tx pgx.Tx, src *source, rows []*row, ingestedAt time.Time) error {
	if src.mirror != nil {
		return w.copyChanges(ctx, tx, src, rows, ingestedAt)
	}
	fast, known := w.rawBinary[src]
	if !known {
		var err error
		if fast, err = rawTypesMatch(ctx, tx, src); err != nil {
			return err
		}
		if w.rawBinary == nil {
			w.rawBinary = map[*source]bool{}
		}
		w.rawBinary[src] = fast
	}
	if fast {
		_, err := tx.Conn().PgConn().CopyFrom(ctx, newRawCopy(rows, ingestedAt), raw.EventColumns.CopySQL(src.raw.Ident(), true))
		return err
	}
	// pgx encodes each row's values before it asks for the next row, so
	// one slice serves every row.
	vals, at := make([]any, len(raw.EventColumns)), any(ingestedAt)
	_, err := tx.CopyFrom(ctx, raw.TableName(src.name), raw.EventColumns.Names(), pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
		r := rows[i]
		vals[0], vals[1], vals[2], vals[3], vals[4], vals[5], vals[6] = r.ev.ID, r.ev.Time, at, r.ev.Payload, r.rec.Topic, r.rec.Partition, r.rec.Offset
		return vals, nil
	}))
	return err
}

// insertCheckingRows stores rows one at a time, in order, each under a
// savepoint. A row is a duplicate, and skipped, when an earlier row stored
// its event, or, for a source with dedupe.by: event_id, when claims does
// not give its id to the batch or an earlier row stored it: an event is a
// duplicate only of a copy that was stored, so a copy the warehouse
// refuses leaves the next copy to be stored. It returns the rows stored,
// the rows refused as dead letters and the id duplicates per source, and
// releases the ids claimed for which no row was stored. The batch itself
// is left as it is, so a failed attempt leaves nothing behind.
func (w *writer) insertCheckingRows(ctx context.Context, tx pgx.Tx, rows []*row, claims idClaims, ingestedAt time.Time) ([]*row, []deadLetter, map[*source]int, error) {
	if err := w.commitInTwoPhases(ctx, tx, rows); err != nil {
		return nil, nil, nil, err
	}
	kept := make([]*row, 0, len(rows))
	var rejected []deadLetter
	idDups := map[*source]int{}
	storedEvents, storedIDs := map[eventKey]bool{}, map[idKey]bool{}
	for _, r := range rows {
		if r.src.mirror != nil {
			continue // insertCheckingChanges stores it with its mirror change
		}
		if storedEvents[keyOf(r)] {
			continue
		}
		ik := idKey{r.src, r.ev.ID}
		if r.src.dedupeWindow > 0 && (!claims.ours(ik) || storedIDs[ik]) {
			idDups[r.src]++
			continue
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		_, err = sp.Exec(ctx, raw.EventColumns.InsertSQL(r.src.raw.Ident()),
			r.ev.ID, r.ev.Time, ingestedAt, r.ev.Payload, r.rec.Topic, r.rec.Partition, r.rec.Offset)
		if err == nil {
			if err := sp.Commit(ctx); err != nil {
				return nil, nil, nil, err
			}
			kept = append(kept, r)
			storedEvents[keyOf(r)], storedIDs[ik] = true, true
			continue
		}
		if rbErr := sp.Rollback(ctx); rbErr != nil {
			return nil, nil, nil, forSource(r.src, rbErr)
		}
		if err := classifyRowError(err, r.src); !errors.Is(err, errBadRow) {
			return nil, nil, nil, err
		}
		rejected = append(rejected, deadLetter{src: r.src, rej: decode.Rejection{Reason: decode.ReasonRejectedByStore, Detail: err.Error()}, rec: r.rec})
	}
	if err := w.releaseIDs(ctx, tx, claims.unused(rows, storedIDs)); err != nil {
		return nil, nil, nil, err
	}
	return kept, rejected, idDups, nil
}

// commitInTwoPhases makes tx commit with two-phase commit on the Citus
// workers when the rows go into a distributed raw table one by one: Citus
// would otherwise commit rows that all reached one worker before the
// coordinator's own part, and a coordinator failing in between would keep
// them without their ledger and offsets (citus.CommitInTwoPhases).
func (w *writer) commitInTwoPhases(ctx context.Context, tx pgx.Tx, rows []*row) error {
	src, err := w.distributedSource(ctx, tx, rows)
	if err != nil || src == nil {
		return err
	}
	return forSource(src, citus.CommitInTwoPhases(ctx, tx.Conn().PgConn(), src.raw.Ident()))
}

// distributedSource returns the first source of rows whose raw table is a
// Citus distributed table, or nil.
func (w *writer) distributedSource(ctx context.Context, tx pgx.Tx, rows []*row) (*source, error) {
	seen := map[*source]bool{}
	for _, r := range rows {
		src := r.src
		if src.mirror != nil || seen[src] {
			continue // a change table is never distributed
		}
		seen[src] = true
		dist, known := w.distributed[src]
		if !known {
			var err error
			if dist, err = citus.Distributed(ctx, tx, src.raw.Ident()); err != nil {
				return nil, err
			}
			if w.distributed == nil {
				w.distributed = map[*source]bool{}
			}
			w.distributed[src] = dist
		}
		if dist {
			return src, nil
		}
	}
	return nil, nil
}

// classifyRowError sorts the errors of writing src's rows: a missing raw
// partition (dropped, or never attached), a conflict with a concurrent
// transaction (a duplicate key another ingester stored meanwhile, a
// serialization failure or a deadlock), and rows the warehouse refuses;
// anything else is returned as it is. Each is attributed to src.
func classifyRowError(err error, src *source) error {
	switch {
	case pgerr.MissingPartition(err):
		src.raw.Forget()
		err = fmt.Errorf("%w: %w", raw.ErrMissingPartition, err)
	case pgerr.UniqueViolation(err) || pgerr.Retryable(err):
		err = fmt.Errorf("%w: %w", errRetryNow, err)
	case pgerr.BadRow(err):
		err = fmt.Errorf("%w: %w", errBadRow, err)
	}
	return forSource(src, err)
}

// written counts the rows a write stored, fresh of batch b: per Kafka
// partition, and per source and hour for the ledger. When every row was
// stored these are the counts the batch kept as rows were added.
func written(b *batch, fresh []*row) (map[topicPartition]int, *raw.Ledger) {
	inserted := map[topicPartition]int{}
	if len(fresh) == len(b.rows) {
		for tp, pb := range b.parts {
			inserted[tp] = pb.good
		}
		return inserted, &b.ledger
	}
	ledger := &raw.Ledger{}
	for _, r := range fresh {
		inserted[topicPartition{r.rec.Topic, r.rec.Partition}]++
		ledger.Add(r.src.name, r.ev.Time)
	}
	return inserted, ledger
}

// storeLedgerAndOffsets writes the ledger rows (as written counts them)
// and the partitions' new positions, in one round trip.
func (w *writer) storeLedgerAndOffsets(ctx context.Context, tx pgx.Tx, b *batch, ledger *raw.Ledger, ingestedAt time.Time,
	inserted map[topicPartition]int, rejected []deadLetter) error {
	qb := &pgx.Batch{}
	queued := ledger.Queue(qb, ingestedAt)
	parts := w.queueOffsets(qb, b, ingestedAt, inserted, rejected)
	br := tx.SendBatch(ctx, qb)
	defer br.Close()
	if queued {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("write ledger: %w", err)
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return fmt.Errorf("store offsets: %w", err)
	}
	if tag.RowsAffected() != int64(parts) {
		return fmt.Errorf("store offsets: %d of %d partitions' rows found; were rows of tidemark.kafka_offsets deleted while ingesting?", tag.RowsAffected(), parts)
	}
	return br.Close()
}

func (w *writer) copyDeadLetters(ctx context.Context, tx pgx.Tx, dead []deadLetter, ingestedAt time.Time) error {
	if len(dead) == 0 {
		return nil
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"tidemark", "dead_letters"}, deadLetterColumns, pgx.CopyFromSlice(len(dead), func(i int) ([]any, error) {
		d := &dead[i]
		keys := make([][]byte, len(d.rec.Headers))
		vals := make([][]byte, len(d.rec.Headers))
		for j, h := range d.rec.Headers {
			keys[j], vals[j] = []byte(h.Key), h.Value
		}
		var ts pgtype.Timestamptz
		if !d.rec.Timestamp.IsZero() {
			ts = pgtype.Timestamptz{Time: d.rec.Timestamp, Valid: true}
		}
		return []any{d.src.name, d.rej.Reason, cleanText(d.rej.Detail), d.rec.Topic, d.rec.Partition, d.rec.Offset,
			d.rec.Key, d.rec.Value, keys, vals, ts, ingestedAt}, nil
	}))
	if err != nil {
		return fmt.Errorf("copy dead letters: %w", err)
	}
	return nil
}

// queueOffsets queues the update of the batch's partitions' rows: next
// positions and running totals. It returns how many rows that must find.
func (w *writer) queueOffsets(qb *pgx.Batch, b *batch, ingestedAt time.Time, inserted map[topicPartition]int, rejected []deadLetter) int {
	refused := map[topicPartition]int{}
	for _, d := range rejected {
		refused[topicPartition{d.rec.Topic, d.rec.Partition}]++
	}
	tps := sortedParts(b)
	n := len(tps)
	var (
		topics   = make([]string, n)
		parts    = make([]int32, n)
		sources  = make([]string, n)
		next     = make([]int64, n)
		epochs   = make([]int32, n)
		maxTimes = make([]pgtype.Timestamptz, n)
		records  = make([]int64, n)
		written  = make([]int64, n)
		dups     = make([]int64, n)
		dead     = make([]int64, n)
	)
	for i, tp := range tps {
		pb := b.parts[tp]
		topics[i], parts[i], sources[i] = tp.Topic, tp.Partition, pb.source.name
		next[i], epochs[i] = pb.next.Offset, pb.next.Epoch
		if !pb.maxEventTime.IsZero() {
			maxTimes[i] = pgtype.Timestamptz{Time: pb.maxEventTime, Valid: true}
		}
		good := pb.good - refused[tp]
		records[i], written[i] = int64(pb.records), int64(inserted[tp])
		dups[i], dead[i] = int64(good-inserted[tp]), int64(pb.dead+refused[tp])
	}
	qb.Queue(updateOffsetsSQL, w.group, ingestedAt, topics, parts, sources, next, epochs, maxTimes,
		records, written, dups, dead)
	return n
}

// cleanText makes s storable as PostgreSQL text.
func cleanText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "")
}
