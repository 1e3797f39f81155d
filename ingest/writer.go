package ingest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// createStageSQL creates the per-connection staging table that each batch
// is copied into before one set-based insert into the raw tables.
const createStageSQL = `
CREATE TEMP TABLE IF NOT EXISTS tidemark_stage (
    src             smallint    NOT NULL,
    event_id        text        NOT NULL,
    event_time      timestamptz NOT NULL,
    payload         jsonb       NOT NULL,
    kafka_topic     text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL
) ON COMMIT DELETE ROWS`

var stageColumns = []string{"src", "event_id", "event_time", "payload", "kafka_topic", "kafka_partition", "kafka_offset"}

// claimOffsetsSQL makes sure each partition of the batch has an offsets row
// (so that it can be locked), in a fixed order to avoid deadlocks between
// ingesters.
const claimOffsetsSQL = `
INSERT INTO tidemark.kafka_offsets (consumer_group, topic, partition, source, next_offset)
SELECT $1, u.topic, u.partition, u.source, -1
FROM unnest($2::text[], $3::integer[], $4::text[]) AS u (topic, partition, source)
ORDER BY u.topic, u.partition
ON CONFLICT DO NOTHING`

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

// insertRawSQL moves one source's staged rows into its raw table, dropping
// duplicates, and writes one ledger row per UTC hour of event time that
// the inserted rows touch. It returns the inserted count per partition.
// %s is the quoted raw table. $1 source index in the stage, $2 ingested_at,
// $3 source name.
const insertRawSQL = `
WITH ins AS (
    INSERT INTO %s (event_id, event_time, ingested_at, payload, kafka_topic, kafka_partition, kafka_offset)
    SELECT event_id, event_time, $2, payload, kafka_topic, kafka_partition, kafka_offset
    FROM pg_temp.tidemark_stage
    WHERE src = $1
    ON CONFLICT (event_id, event_time) DO NOTHING
    RETURNING event_time, kafka_topic, kafka_partition
), ledger AS (
    INSERT INTO tidemark.ingest_ledger (source, load_xid, bucket, rows, min_event_time, max_event_time, ingested_at)
    SELECT $3, pg_current_xact_id(), date_bin('1 hour', event_time, timestamptz '2000-01-01 00:00:00+00'),
           count(*), min(event_time), max(event_time), $2
    FROM ins
    GROUP BY 3
)
SELECT kafka_topic, kafka_partition, count(*) FROM ins GROUP BY 1, 2`

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

// writeResult is what one committed batch did.
type writeResult struct {
	// conflicts holds the stored positions of partitions whose records
	// were dropped because another ingester had advanced them.
	conflicts map[topicPartition]position
	// inserted counts new raw rows per partition; the rest of each
	// partition's good records were duplicates.
	inserted map[topicPartition]int
	// rejected counts rows the warehouse refused, now dead letters.
	rejected int
	// committed is false when nothing was left to write.
	committed bool
}

// writer writes batches on one dedicated connection.
type writer struct {
	group string
	conn  *pgx.Conn
}

// errBadRow means the warehouse rejected the content of some row; the batch
// is retried with each row checked on its own.
var errBadRow = errors.New("the warehouse rejected a row")

// errMissingPartition means a raw partition disappeared after it was seen.
var errMissingPartition = errors.New("raw partition missing")

// write runs one attempt of the batch transaction. expected holds the
// positions this ingester believes are stored. When checkRows is set,
// every row is staged on its own and rows the warehouse refuses become
// dead letters (the batch is changed accordingly).
func (w *writer) write(ctx context.Context, b *batch, expected map[topicPartition]position, ingestedAt time.Time, checkRows bool) (writeResult, error) {
	res := writeResult{conflicts: map[topicPartition]position{}, inserted: map[topicPartition]int{}}
	if err := w.ensurePartitions(ctx, b); err != nil {
		return res, err
	}
	tx, err := w.conn.Begin(ctx)
	if err != nil {
		return res, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	stored, err := w.lockOffsets(ctx, tx, b)
	if err != nil {
		return res, err
	}
	stale := map[topicPartition]bool{}
	for tp := range b.parts {
		exp, ok := expected[tp]
		if !ok {
			exp = noPosition
		}
		if cur := stored[tp]; cur.Offset != exp.Offset {
			stale[tp] = true
			res.conflicts[tp] = cur
		}
	}
	b.drop(stale)
	if b.empty() {
		return res, nil
	}

	if checkRows {
		if res.rejected, err = w.stageCheckingRows(ctx, tx, b); err != nil {
			return res, err
		}
	} else if err := w.stage(ctx, tx, b); err != nil {
		return res, err
	}
	if err := w.insertRaw(ctx, tx, b, ingestedAt, res.inserted); err != nil {
		return res, err
	}
	if err := w.copyDeadLetters(ctx, tx, b, ingestedAt); err != nil {
		return res, err
	}
	if err := w.updateOffsets(ctx, tx, b, ingestedAt, res.inserted); err != nil {
		return res, err
	}
	if err := tx.Commit(ctx); err != nil {
		return res, err
	}
	res.committed = true
	return res, nil
}

func (w *writer) ensurePartitions(ctx context.Context, b *batch) error {
	bySource := map[*source][]time.Time{}
	for _, r := range b.rows {
		bySource[r.src] = append(bySource[r.src], r.ev.Time)
	}
	for src, times := range bySource {
		if err := src.raw.EnsurePartitions(ctx, w.conn, src.raw.Missing(times)); err != nil {
			return err
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

func (w *writer) lockOffsets(ctx context.Context, tx pgx.Tx, b *batch) (map[topicPartition]position, error) {
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
	br := tx.SendBatch(ctx, qb)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("claim offsets: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("lock offsets: %w", err)
	}
	stored := map[topicPartition]position{}
	for rows.Next() {
		var tp topicPartition
		var p position
		if err := rows.Scan(&tp.Topic, &tp.Partition, &p.Offset, &p.Epoch); err != nil {
			return nil, fmt.Errorf("lock offsets: %w", err)
		}
		stored[tp] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lock offsets: %w", err)
	}
	return stored, br.Close()
}

func (w *writer) stage(ctx context.Context, tx pgx.Tx, b *batch) error {
	if _, err := tx.Exec(ctx, createStageSQL); err != nil {
		return fmt.Errorf("create staging table: %w", err)
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"tidemark_stage"}, stageColumns, pgx.CopyFromSlice(len(b.rows), func(i int) ([]any, error) {
		r := &b.rows[i]
		return []any{r.src.idx, r.ev.ID, r.ev.Time, r.ev.Payload, r.rec.Topic, r.rec.Partition, r.rec.Offset}, nil
	}))
	if err != nil {
		if isBadRow(err) {
			return fmt.Errorf("%w: %w", errBadRow, err)
		}
		return fmt.Errorf("copy into staging: %w", err)
	}
	return nil
}

// stageCheckingRows stages rows one at a time, each under a savepoint, and
// turns the rows the warehouse refuses into dead letters.
func (w *writer) stageCheckingRows(ctx context.Context, tx pgx.Tx, b *batch) (int, error) {
	if _, err := tx.Exec(ctx, createStageSQL); err != nil {
		return 0, fmt.Errorf("create staging table: %w", err)
	}
	insert := "INSERT INTO pg_temp.tidemark_stage (" + strings.Join(stageColumns, ", ") + ") VALUES ($1, $2, $3, $4, $5, $6, $7)"
	kept := b.rows[:0]
	rejected := 0
	for _, r := range b.rows {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return rejected, err
		}
		_, err = sp.Exec(ctx, insert, r.src.idx, r.ev.ID, r.ev.Time, r.ev.Payload, r.rec.Topic, r.rec.Partition, r.rec.Offset)
		if err == nil {
			if err := sp.Commit(ctx); err != nil {
				return rejected, err
			}
			kept = append(kept, r)
			continue
		}
		if rbErr := sp.Rollback(ctx); rbErr != nil {
			return rejected, rbErr
		}
		if !isBadRow(err) {
			return rejected, err
		}
		rejected++
		pb := b.parts[topicPartition{r.rec.Topic, r.rec.Partition}]
		pb.good--
		pb.dead++
		b.dead = append(b.dead, deadLetter{src: r.src, rej: Rejection{ReasonRejectedByStore, err.Error()}, rec: r.rec})
	}
	clear(b.rows[len(kept):])
	b.rows = kept
	return rejected, nil
}

func (w *writer) insertRaw(ctx context.Context, tx pgx.Tx, b *batch, ingestedAt time.Time, inserted map[topicPartition]int) error {
	seen := map[*source]bool{}
	for _, r := range b.rows {
		if seen[r.src] {
			continue
		}
		seen[r.src] = true
		rows, err := tx.Query(ctx, fmt.Sprintf(insertRawSQL, r.src.raw.Ident()), r.src.idx, ingestedAt, r.src.name)
		if err != nil {
			return fmt.Errorf("insert into %s: %w", r.src.raw.Ident(), err)
		}
		for rows.Next() {
			var tp topicPartition
			var n int
			if err := rows.Scan(&tp.Topic, &tp.Partition, &n); err != nil {
				rows.Close()
				return fmt.Errorf("insert into %s: %w", r.src.raw.Ident(), err)
			}
			inserted[tp] += n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.Contains(pgErr.Message, "no partition") {
				r.src.raw.Forget()
				return fmt.Errorf("%w: %w", errMissingPartition, err)
			}
			return fmt.Errorf("insert into %s: %w", r.src.raw.Ident(), err)
		}
	}
	return nil
}

func (w *writer) copyDeadLetters(ctx context.Context, tx pgx.Tx, b *batch, ingestedAt time.Time) error {
	if len(b.dead) == 0 {
		return nil
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"tidemark", "dead_letters"}, deadLetterColumns, pgx.CopyFromSlice(len(b.dead), func(i int) ([]any, error) {
		d := &b.dead[i]
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

func (w *writer) updateOffsets(ctx context.Context, tx pgx.Tx, b *batch, ingestedAt time.Time, inserted map[topicPartition]int) error {
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
		records[i], written[i] = int64(pb.records), int64(inserted[tp])
		dups[i], dead[i] = int64(pb.good-inserted[tp]), int64(pb.dead)
	}
	_, err := tx.Exec(ctx, updateOffsetsSQL, w.group, ingestedAt, topics, parts, sources, next, epochs, maxTimes,
		records, written, dups, dead)
	if err != nil {
		return fmt.Errorf("store offsets: %w", err)
	}
	return nil
}

// isBadRow reports whether err is PostgreSQL refusing a value: a data
// exception (class 22) or a program limit such as an oversized index row
// (class 54).
func isBadRow(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "54")
}

// cleanText makes s storable as PostgreSQL text.
func cleanText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "")
}
