package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/raw"
)

// selectDeadLettersSQL reads the next chunk of a source's dead letters not
// yet replayed, after id $2, in id order (the index
// dead_letters_not_replayed): $3 a reason or NULL, $4 the least
// ingested_at or NULL, $5 the chunk size.
const selectDeadLettersSQL = `
SELECT id, topic, partition, "offset", record_key, record_value, header_keys, header_values, record_timestamp
FROM tidemark.dead_letters
WHERE source = $1 AND replayed_at IS NULL AND id > $2
  AND ($3::text IS NULL OR reason = $3)
  AND ($4::timestamptz IS NULL OR ingested_at >= $4)
ORDER BY id
LIMIT $5`

// lockDeadLettersSQL is selectDeadLettersSQL for a replay that loads: the
// chunk's rows stay locked until its transaction ends, and rows another
// replay holds are left to it.
const lockDeadLettersSQL = selectDeadLettersSQL + `
FOR UPDATE SKIP LOCKED`

// markReplayedSQL marks dead letters replayed, in the transaction that
// stored their events.
const markReplayedSQL = `UPDATE tidemark.dead_letters SET replayed_at = $2 WHERE id = ANY($1::bigint[])`

// existingPartitionsSQL returns which of the quoted raw partition names
// exist, for a dry run, which must not create them.
const existingPartitionsSQL = `SELECT n FROM unnest($1::text[]) AS n WHERE to_regclass(n) IS NOT NULL`

// listDeadLettersSQL counts dead letters by source and reason, replayed
// and not, with the oldest and newest arrival; $1 a source or NULL.
const listDeadLettersSQL = `
SELECT source, reason, count(*) FILTER (WHERE replayed_at IS NULL), count(*) FILTER (WHERE replayed_at IS NOT NULL),
       min(ingested_at), max(ingested_at)
FROM tidemark.dead_letters
WHERE $1::text IS NULL OR source = $1
GROUP BY source, reason
ORDER BY source, reason`

// DefaultReplayChunk is how many dead letters one replay transaction reads.
const DefaultReplayChunk = 1000

// replayAttempts bounds the attempts of one chunk: conflicts with a
// concurrent load, raw partitions created or dropped meanwhile.
const replayAttempts = 6

// ErrNotKafkaSource means a replay named a source that is not a Kafka
// source of the configuration.
var ErrNotKafkaSource = errors.New("not a Kafka source of the configuration")

// ReplayOptions selects the dead letters Replay loads again.
type ReplayOptions struct {
	// Source is the Kafka source whose dead letters are replayed.
	Source string
	// Reason, when set, replays only dead letters stored with it.
	Reason string
	// Since, when set, replays only dead letters that arrived at or after it.
	Since time.Time
	// DryRun decodes and probes, and writes nothing.
	DryRun bool
	// ChunkSize is how many dead letters one transaction reads;
	// DefaultReplayChunk when zero.
	ChunkSize int
	// Now is the service clock, for the event-time range check and the
	// ingestion time; time.Now when nil.
	Now func() time.Time
	// Logger logs each chunk at debug level; none when nil.
	Logger *slog.Logger
}

// ReplayReport is what a replay did, or with DryRun would do.
type ReplayReport struct {
	Source string
	DryRun bool
	// Read counts the dead letters read: not replayed before and selected.
	Read int
	// Loaded counts the events written to raw.<source> (would be, in a
	// dry run); their dead letters are marked replayed.
	Loaded int
	// AlreadyStored counts dead letters whose event raw.<source> held
	// already, that repeat one loaded before them, or, on a source with
	// dedupe.by: event_id, whose id was loaded within the window; they
	// are marked replayed too.
	AlreadyStored int
	// Failing counts, by reason, the dead letters that still cannot be
	// loaded; they are left as they were.
	Failing map[string]int
	// First and Last are the least and greatest event time loaded; zero
	// when nothing was.
	First, Last time.Time
}

// replayer replays the dead letters of one source.
type replayer struct {
	opts ReplayOptions
	src  *source
	w    *writer
	wait time.Duration // bounds each attempt at a chunk
	rep  ReplayReport
}

// chunkResult is what one chunk did.
type chunkResult struct {
	last    int64 // the greatest id read
	read    int
	loaded  []*row
	stored  int
	failing map[string]int
}

// Replay decodes the dead letters of a Kafka source that were not
// replayed, with the source's current configuration, and loads those that
// now decode as the ingester would: their events into raw.<source>,
// unless stored already, with their ledger rows, and their dead letters
// marked replayed in the same transaction, one transaction per chunk.
// Dead letters that still fail are left as they are. conn is a
// connection of its own: raw partitions are created on it between chunks.
func Replay(ctx context.Context, conn *pgx.Conn, c Config, opts ReplayOptions) (ReplayReport, error) {
	var err error
	sc := c.source(opts.Source)
	if sc == nil {
		return ReplayReport{}, fmt.Errorf("replay %s: %w", opts.Source, ErrNotKafkaSource)
	}
	if err := c.validateReplay(); err != nil {
		return ReplayReport{}, fmt.Errorf("replay %s: %w", opts.Source, err)
	}
	if err := sc.validate(); err != nil {
		return ReplayReport{}, fmt.Errorf("replay %s: %w", opts.Source, err)
	}
	if opts.ChunkSize <= 0 {
		opts.ChunkSize = DefaultReplayChunk
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	var reg *decode.Registry
	if sc.Registry {
		if c.SchemaRegistry == nil {
			return ReplayReport{}, fmt.Errorf("replay %s: ingest: SchemaRegistry is required: the source reads the schema registry", opts.Source)
		}
		if reg, err = decode.NewRegistry(*c.SchemaRegistry); err != nil {
			return ReplayReport{}, fmt.Errorf("replay %s: %w", opts.Source, err)
		}
	}
	src, err := newSource(*sc, reg)
	if err != nil {
		return ReplayReport{}, fmt.Errorf("replay %s: %w", opts.Source, err)
	}
	r := &replayer{
		opts: opts,
		src:  src,
		w:    &writer{group: c.Group, conn: conn},
		wait: c.WriteTimeout,
		rep:  ReplayReport{Source: opts.Source, DryRun: opts.DryRun, Failing: map[string]int{}},
	}
	ectx, cancel := context.WithTimeout(ctx, r.wait)
	err = r.prepare(ectx)
	cancel()
	if err != nil {
		return r.rep, fmt.Errorf("replay %s: %w", opts.Source, withFix(err))
	}
	for after := int64(0); ; {
		res, err := r.chunk(ctx, after)
		if err != nil {
			return r.rep, fmt.Errorf("replay %s: dead letters after id %d: %w", opts.Source, after, withFix(err))
		}
		if res.read == 0 {
			return r.rep, nil
		}
		r.add(res)
		after = res.last
	}
}

// prepare makes the source's raw table and reads its mirror, as the
// ingester does at start; a dry run only reads the mirror's key, which
// the decoder takes a change's key from.
func (r *replayer) prepare(ctx context.Context) error {
	if !r.opts.DryRun {
		return r.w.prepare(ctx, r.src)
	}
	if r.src.mirror == nil {
		return nil
	}
	if err := r.src.mirror.readTable(ctx, r.w.conn, r.src.raw.Ident()); err != nil && !pgerr.MissingPartition(err) {
		return err
	}
	_, key, exists, err := mirror.ReadTarget(ctx, r.w.conn, r.src.mirror.target)
	if exists && err == nil {
		r.src.dec.SetMirrorKey(key)
	}
	return err
}

// withFix adds to err what the operator does about it, when it says.
func withFix(err error) error {
	var fe *fixError
	if errors.As(err, &fe) {
		return fmt.Errorf("%w; fix: %s", err, fe.fix)
	}
	return err
}

// add counts a chunk's result into the report.
func (r *replayer) add(res chunkResult) {
	r.rep.Read += res.read
	r.rep.Loaded += len(res.loaded)
	r.rep.AlreadyStored += res.stored
	for reason, n := range res.failing {
		r.rep.Failing[reason] += n
	}
	for _, row := range res.loaded {
		if r.rep.First.IsZero() || row.ev.Time.Before(r.rep.First) {
			r.rep.First = row.ev.Time
		}
		if row.ev.Time.After(r.rep.Last) {
			r.rep.Last = row.ev.Time
		}
	}
	r.opts.Logger.Debug("replayed a chunk of dead letters", "source", r.src.name, "last_id", res.last,
		"read", res.read, "loaded", len(res.loaded), "already_stored", res.stored)
}

// chunk replays the dead letters after id after, trying again after a
// conflict with a concurrent load or a raw partition created or dropped
// meanwhile, and row by row after the warehouse refused a row.
func (r *replayer) chunk(ctx context.Context, after int64) (chunkResult, error) {
	checkRows := false
	retry := backoff.Backoff{First: 10 * time.Millisecond, Max: time.Second, Jitter: 0.5}
	for {
		res, err := r.chunkOnce(ctx, after, checkRows)
		switch {
		case err == nil:
			return res, nil
		case errors.Is(err, errBadRow) && !checkRows:
			checkRows = true
			continue
		case retry.Failures() < replayAttempts &&
			(errors.Is(err, errRetryNow) || errors.Is(err, raw.ErrMissingPartition) || errors.Is(err, errPartitionsCreated)):
			if werr := retry.Wait(ctx); werr != nil {
				return chunkResult{}, werr
			}
			continue
		}
		return chunkResult{}, err
	}
}

// errPartitionsCreated means a chunk created the raw partitions it
// needed, outside its transaction, and is to be read again.
var errPartitionsCreated = errors.New("raw partitions created; reading the chunk again")

// chunkOnce runs one transaction over the dead letters after id after,
// within warehouse.write_timeout.
func (r *replayer) chunkOnce(ctx context.Context, after int64, checkRows bool) (chunkResult, error) {
	ctx, cancel := context.WithTimeout(ctx, r.wait)
	defer cancel()
	tx, err := r.w.conn.Begin(ctx)
	if err != nil {
		return chunkResult{}, err
	}
	defer pgconnect.Rollback(ctx, tx)
	b, ids, res, err := r.read(ctx, tx, after)
	if err != nil || len(b.rows) == 0 {
		return res, err
	}
	if r.opts.DryRun {
		return r.probe(ctx, tx, b, res)
	}
	if missing := r.src.raw.Missing(b.ledger.Hours(r.src.name)); len(missing) > 0 {
		if err := tx.Rollback(ctx); err != nil {
			return res, err
		}
		if err := r.src.raw.EnsurePartitions(ctx, r.w.conn, missing); err != nil {
			return res, err
		}
		return res, errPartitionsCreated
	}
	if m := r.src.mirror; m != nil && !m.plan(rowsOf(b)).empty() {
		// The changes need the mirror changed first (columns added or
		// widened), outside the chunk's transaction.
		if err := tx.Rollback(ctx); err != nil {
			return res, err
		}
		if err := m.ensure(ctx, r.w.conn, r.src, rowsOf(b)); err != nil {
			return res, err
		}
		return res, errPartitionsCreated
	}
	now := r.opts.Now()
	fresh, rejected, err := r.w.storeReplayed(ctx, tx, b, now, checkRows)
	if err != nil {
		return res, err
	}
	refused := make(map[*kgo.Record]bool, len(rejected))
	for _, d := range rejected {
		refused[d.rec] = true
		res.failing[d.rej.Reason]++
	}
	done := make([]int64, 0, len(b.rows))
	for i := range b.rows {
		if rec := b.rows[i].rec; !refused[rec] {
			done = append(done, ids[rec])
		}
	}
	if _, err := tx.Exec(ctx, markReplayedSQL, done, now); err != nil {
		return res, fmt.Errorf("mark dead letters replayed: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return res, err
	}
	res.loaded, res.stored = fresh, len(done)-len(fresh)
	return res, nil
}

// read selects the next chunk, locking it unless this is a dry run, and
// decodes it: the records that now decode as a batch, the id of each
// one's dead letter, and the chunk's size, last id and failures.
func (r *replayer) read(ctx context.Context, tx pgx.Tx, after int64) (*batch, map[*kgo.Record]int64, chunkResult, error) {
	query := lockDeadLettersSQL
	if r.opts.DryRun {
		query = selectDeadLettersSQL
	}
	var reason *string
	if r.opts.Reason != "" {
		reason = &r.opts.Reason
	}
	var since pgtype.Timestamptz
	if !r.opts.Since.IsZero() {
		since = pgtype.Timestamptz{Time: r.opts.Since, Valid: true}
	}
	res := chunkResult{failing: map[string]int{}}
	rows, err := tx.Query(ctx, query, r.src.name, after, reason, since, r.opts.ChunkSize)
	if err != nil {
		return nil, nil, res, fmt.Errorf("read dead letters: %w", err)
	}
	defer rows.Close()
	b, ids, now := newBatch(), map[*kgo.Record]int64{}, r.opts.Now()
	var recs []*kgo.Record
	for rows.Next() {
		id, rec, err := scanRecord(rows)
		if err != nil {
			return nil, nil, res, fmt.Errorf("read dead letters: %w", err)
		}
		res.last, res.read = id, res.read+1
		ids[rec] = id
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, res, fmt.Errorf("read dead letters: %w", err)
	}
	schemas, err := r.resolve(ctx, recs)
	if err != nil {
		return nil, nil, res, err
	}
	for _, rec := range recs {
		ev, rej := r.src.dec.DecodeWith(rec, now, schemas)
		if rej == nil && r.src.mirror != nil {
			rej = r.src.mirror.check(ev.Change)
		}
		if rej != nil {
			res.failing[rej.Reason]++
			delete(ids, rec)
			continue
		}
		b.add(r.src, rec, ev, nil, now)
	}
	if r.src.mirror != nil {
		// Changes are applied in the order of their source positions,
		// as the connector sent them, whatever order they failed in.
		slices.SortStableFunc(b.rows, func(x, y row) int { return slices.Compare(x.ev.Change.Position, y.ev.Change.Position) })
	}
	return b, ids, res, nil
}

// replayRegistryAttempts bounds the attempts at the schema registry for
// one chunk of a replay: an unavailable registry fails the replay, whose
// dead letters stay as they are.
const replayRegistryAttempts = 5

// resolve gets the schemas of a chunk's records, retrying with backoff
// while the registry is unavailable.
func (r *replayer) resolve(ctx context.Context, recs []*kgo.Record) (decode.Schemas, error) {
	retry := backoff.Backoff{First: registryRetryFirst, Max: 5 * time.Second, Jitter: 0.5}
	for {
		s, err := r.src.dec.Resolve(ctx, recs)
		if err == nil || retry.Failures() >= replayRegistryAttempts-1 {
			return s, err
		}
		r.opts.Logger.Warn("schema registry unavailable; retrying", "source", r.src.name, "err", err)
		if werr := retry.Wait(ctx); werr != nil {
			return nil, err
		}
	}
}

// scanRecord rebuilds the Kafka record a dead letter was made from.
func scanRecord(rows pgx.Rows) (int64, *kgo.Record, error) {
	var (
		id         int64
		topic      pgtype.Text
		part       pgtype.Int4
		offset     pgtype.Int8
		keys, vals [][]byte
		ts         pgtype.Timestamptz
		rec        kgo.Record
	)
	if err := rows.Scan(&id, &topic, &part, &offset, &rec.Key, &rec.Value, &keys, &vals, &ts); err != nil {
		return 0, nil, err
	}
	rec.Topic, rec.Partition, rec.Offset = topic.String, part.Int32, offset.Int64
	if ts.Valid {
		rec.Timestamp = ts.Time
	}
	for i := range min(len(keys), len(vals)) {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: string(keys[i]), Value: vals[i]})
	}
	return id, &rec, nil
}

// probe counts, for a dry run, which of b's events raw.<source> holds
// already, with the writer's probe over the raw partitions that exist;
// events of partitions not yet created would all load.
func (r *replayer) probe(ctx context.Context, tx pgx.Tx, b *batch, res chunkResult) (chunkResult, error) {
	fresh := firstOfEach(rowsOf(b))
	names := map[time.Time]string{}
	for _, row := range fresh {
		start := r.src.raw.PartitionStart(row.ev.Time)
		names[start] = pgquote.Ident(raw.Schema, r.src.raw.PartitionName(start))
	}
	list := make([]string, 0, len(names))
	for _, n := range names {
		list = append(list, n)
	}
	var existing []string
	rows, err := tx.Query(ctx, existingPartitionsSQL, list)
	if err == nil {
		existing, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return res, fmt.Errorf("look up raw partitions: %w", err)
	}
	exists := map[string]bool{}
	for _, n := range existing {
		exists[n] = true
	}
	probed := newBatch()
	for _, row := range fresh {
		if exists[names[r.src.raw.PartitionStart(row.ev.Time)]] {
			probed.rows = append(probed.rows, *row)
		}
	}
	inRaw, err := probeStored(ctx, tx, firstOfEach(rowsOf(probed)))
	if err != nil {
		return res, err
	}
	kept := newRows(rowsOf(probed), true, true, inRaw)
	stored := map[*kgo.Record]bool{}
	for _, row := range probed.rows {
		stored[row.rec] = true
	}
	for _, row := range kept {
		delete(stored, row.rec)
	}
	for _, row := range fresh {
		if !stored[row.rec] {
			res.loaded = append(res.loaded, row)
		}
	}
	// A source that dedupes by id drops events whose id was loaded within
	// its window. The claim this makes is rolled back with the dry run's
	// transaction.
	if res.loaded, _, err = r.w.dedupeIDs(ctx, tx, res.loaded, r.opts.Now()); err != nil {
		return res, err
	}
	res.stored = len(b.rows) - len(res.loaded)
	return res, nil
}

// storeReplayed writes the rows of b that raw.<source> does not hold yet,
// and their ledger rows, in tx: the steps writer.write takes for a
// batch's rows (newRows with probing, then COPY, or with checkRows row by
// row, where a copy refused leaves the next copy of its event to be
// stored), without the offsets, which a replay does not move. It returns
// the rows stored and, as dead letters, the rows the warehouse refused.
func (w *writer) storeReplayed(ctx context.Context, tx pgx.Tx, b *batch, ingestedAt time.Time, checkRows bool) ([]*row, []deadLetter, error) {
	rows := rowsOf(b)
	inRaw, err := probeStored(ctx, tx, firstOfEach(rows))
	if err != nil {
		return nil, nil, err
	}
	if len(rows) > 0 && rows[0].src.mirror != nil {
		return w.storeReplayedChanges(ctx, tx, b, inRaw, ingestedAt, checkRows)
	}
	if !checkRows {
		// The probe read the raw shards in this transaction, and on Citus
		// a COPY over those connections would commit on the workers
		// without two-phase commit; rows inserted one by one do.
		dist, err := w.distributedSource(ctx, tx, rows)
		if err != nil {
			return nil, nil, err
		}
		checkRows = dist != nil
	}
	var fresh []*row
	var rejected []deadLetter
	if checkRows {
		candidates := notStored(rows, inRaw)
		claims, err := w.claimIDs(ctx, tx, ingestedAt, candidates)
		if err != nil {
			return nil, nil, err
		}
		if fresh, rejected, _, err = w.insertCheckingRows(ctx, tx, candidates, claims, ingestedAt); err != nil {
			return nil, nil, err
		}
	} else {
		if fresh, _, err = w.dedupeIDs(ctx, tx, newRows(rows, true, true, inRaw), ingestedAt); err != nil {
			return nil, nil, err
		}
		if err := w.copyRows(ctx, tx, fresh, ingestedAt); err != nil {
			return nil, nil, err
		}
	}
	_, ledger := written(b, fresh)
	if err := ledger.Write(ctx, tx, ingestedAt); err != nil {
		return nil, nil, err
	}
	return fresh, rejected, nil
}

// storeReplayedChanges writes the changes of a Debezium source's dead
// letters, b's rows in source position order: the change rows raw.<source>
// does not hold yet, and every change to the mirror, where a change at or
// below a row's stored position is not applied (it was sent again, or a
// later change of the row is there), with their ledger rows, in tx.
// Checking rows, each change is written under a savepoint and those the
// warehouse refuses are returned as dead letters.
func (w *writer) storeReplayedChanges(ctx context.Context, tx pgx.Tx, b *batch, inRaw map[eventKey]bool, ingestedAt time.Time, checkRows bool) ([]*row, []deadLetter, error) {
	rows := rowsOf(b)
	src := rows[0].src
	var fresh []*row
	var rejected []deadLetter
	var err error
	if checkRows {
		fresh, rejected, err = w.insertCheckingChanges(ctx, tx, b, inRaw, ingestedAt, map[*source]bool{src: true})
	} else {
		fresh = newRows(rows, true, true, inRaw)
		if err = w.copyRows(ctx, tx, fresh, ingestedAt); err == nil {
			err = classifyRowError(src.mirror.applyChanges(ctx, tx, rows, ingestedAt), src)
		}
	}
	if err != nil {
		return nil, nil, err
	}
	_, ledger := written(b, fresh)
	if err := ledger.Write(ctx, tx, ingestedAt); err != nil {
		return nil, nil, err
	}
	return fresh, rejected, nil
}

// DeadLetterCount is how many dead letters of one source and reason are
// stored, replayed and not, and when the oldest and newest arrived.
type DeadLetterCount struct {
	Source, Reason        string
	NotReplayed, Replayed int64
	Oldest, Newest        time.Time
}

// ListDeadLetters counts the stored dead letters by source and reason, of
// source only when it is not empty.
func ListDeadLetters(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, source string) ([]DeadLetterCount, error) {
	var src *string
	if source != "" {
		src = &source
	}
	rows, err := q.Query(ctx, listDeadLettersSQL, src)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetterCount, error) {
		var c DeadLetterCount
		err := row.Scan(&c.Source, &c.Reason, &c.NotReplayed, &c.Replayed, &c.Oldest, &c.Newest)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}
