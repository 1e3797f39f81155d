package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/raw"
)

// Options customise an Ingester beyond its configuration.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: metrics are not registered anywhere
	// Now is the service clock: it stamps ingested_at and bounds event
	// times. Tests and the demo replace it; default time.Now.
	Now func() time.Time
	// KafkaOpts are appended to the client options (tests use them).
	KafkaOpts []kgo.Opt
	// ShutdownGrace bounds, from the stop, the batch write under way and
	// the final flush; default 30s.
	ShutdownGrace time.Duration
	// Paused reports whether an operator paused a source (pause.Watch):
	// its topics are not fetched until it is resumed. nil: none is.
	Paused func(source string) bool

	kafkaLogEvery time.Duration // rate limit of Kafka client errors; default kafkaLogEvery
	// registryRetry overrides the waits between attempts at an
	// unavailable schema registry (tests).
	registryRetry *backoff.Backoff
	// stallRetry overrides the first wait before a stalled source is
	// tried again (tests).
	stallRetry time.Duration
	afterSeek  func() // called after fencing moved the consumer (tests)
	// pollingAhead is called as the polling ahead of a batch being
	// written starts a poll that waits for records, with the records it
	// holds; polledAhead when that poll has returned (tests).
	pollingAhead func(held int)
	polledAhead  func()
}

// aheadHooks are Options.pollingAhead and Options.polledAhead.
type aheadHooks struct {
	polling func(held int)
	polled  func()
}

// source is one configured source as the ingester uses it.
type source struct {
	name string
	dec  *decode.Decoder
	raw  *raw.Table
	// dedupeWindow is how long a loaded event id drops later events with
	// the id (dedupe.by: event_id); zero: only (event_id, event_time).
	dedupeWindow time.Duration
	// mirror is the mirror of a Debezium source, nil for others.
	mirror *changeMirror
	// topics are the topics it reads; paused is whether their fetching
	// is paused because an operator paused the source (Run's loop only).
	topics []string
	paused bool
	// prepared is set once its raw table is made and its mirror read
	// (writer.prepare); guarded by the ingester's mu.
	prepared bool
}

// newSource is the source s, for the ingester and for a replay of its
// dead letters alike; reg is the schema registry, nil when no source
// needs it.
func newSource(s Source, reg *decode.Registry) (*source, error) {
	dec, err := decode.NewRegistryDecoder(s.Decoding, reg)
	if err != nil {
		return nil, err
	}
	// raw.<name> holds row changes for a Debezium source, events
	// otherwise.
	rt := raw.NewTable(s.Name, s.RawPartition)
	rt.Changes, rt.Local = s.Mirror != nil, !s.Distribute
	if s.Mirror != nil {
		return &source{name: s.Name, dec: dec, raw: rt, mirror: newChangeMirror(s.Name, s.Mirror, s.Topics, s.Distribute)}, nil
	}
	return &source{name: s.Name, dec: dec, raw: rt, dedupeWindow: s.DedupeWindow}, nil
}

// Ingester consumes the configured Kafka sources as one member of the
// consumer group and writes them to the warehouse. See the package
// documentation for its guarantees.
type Ingester struct {
	conf  Config
	log   *slog.Logger
	m     *metrics
	now   func() time.Time
	grace time.Duration
	// writes ends the shutdown grace after the stop (Run's context
	// cancelled): batch writes under way, the last flush and the
	// questions about lost commit answers share it.
	writes    context.Context
	endWrites context.CancelFunc
	byTopic   map[string]*source
	sources   []*source
	// sizer keeps the client's fetches within kafka.fetch_max_bytes of
	// memory; avgRecordBytes is the records' size in a batch lately
	// (memory.go).
	sizer          *fetchSizer
	avgRecordBytes atomic.Int64
	start          kgo.Offset
	cl             *kgo.Client
	klog           *kafkaLog // the client's log, rate limited
	auth           *kafkaAuth
	// stopClient cancels the client's context: requests in flight, such
	// as a JoinGroup the coordinator holds open, fail at once.
	stopClient context.CancelFunc

	// mu guards b, stored, resetFrom, hwm, reseeked, stopAhead, w,
	// checkRows, retry, retryIn and paused, and the prepared flag of each
	// source. They are used by Run's loop (polling, adding the decoded
	// records to b, writing it) and by the client's goroutines, which call
	// adjustOffsets, onRevoked and onLost (rebalance.go). They share one
	// lock because each step reads or changes several of them together,
	// and mu is held for the whole write of a batch, so that the loop and
	// a callback never write at once and a callback never sees a write
	// half done. Records enter b only above their partition's position in
	// stored (or from resetFrom), and set hwm. A write sends b over w,
	// checked against stored, and prepares its sources; when it succeeds
	// it clears checkRows, and once committed it moves stored, clears
	// resetFrom and sets the lag from hwm. Fencing moves stored and marks
	// reseeked; a stall drops its source's records from b, marks reseeked
	// and adds to paused; both call stopAhead first. A revoke writes b,
	// then a revoke or a loss drops the partitions from b, stored,
	// resetFrom, hwm and paused. retry and retryIn count the failed
	// attempts of either side: writes, preparing the raw tables, reading
	// the stored offsets.
	//
	// The other fields below do not need mu. afterSeek and ahead are set
	// once, in New (test hooks); so are commits, reg, rlog and stallLog. lastErr is atomic. resets (resetsMu), health and stalls
	// have mutexes of their own: readiness and the status page read them
	// while a batch is written, and decoding, which runs without mu, reads
	// health. The committer and the rate-limited logs lock themselves.
	mu     sync.Mutex
	b      *batch
	stored map[topicPartition]position // what the warehouse holds for owned partitions
	// resetFrom holds the partitions whose stored position was beyond the
	// broker's log (reset.go): their records from this offset load,
	// below the stored position, until their next write.
	resetFrom map[topicPartition]int64
	hwm       map[topicPartition]int64
	// reseeked collects the partitions writes moved to another member's
	// stored position (fencing); flushDecodingAhead clears it.
	reseeked map[topicPartition]bool
	// stopAhead, set while flushDecodingAhead writes, ends the polling
	// ahead and waits for it: a seek must not come between its polls.
	stopAhead func()
	afterSeek func()                   // Options.afterSeek
	isPaused  func(source string) bool // Options.Paused
	ahead     aheadHooks
	w         *writer
	// checkRows holds the sources whose rows the last attempt found one
	// refused in: their rows are written one at a time.
	checkRows map[*source]bool
	// retry counts the failed attempts in a row (of writes, of preparing
	// the raw tables, of reading the stored offsets) and spaces them:
	// retryIn is the wait it gave after the last.
	retry   backoff.Backoff
	retryIn time.Duration

	lastErr atomic.Pointer[error]
	// resets are the latest partitions read again below their stored
	// position (reset.go), for the status page.
	resetsMu sync.Mutex
	resets   []OffsetReset
	commits  *committer

	// reg is the schema registry of the sources of a registry format, nil
	// when there are none; health is what the ingester knows of it.
	reg    *decode.Registry
	rlog   *kafkaLog // the registry's warnings, rate limited as the client's
	health registryHealth
	// stalls are the sources whose writes the warehouse refuses
	// (stall.go); stallLog logs them, rate limited per source.
	stalls   stalls
	stallLog *kafkaLog
	// paused (guarded by mu) holds the partitions paused while their
	// records wait for the registry or for their stalled source.
	paused map[topicPartition]pauseKind
}

// withDefaults fills the options left empty.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ShutdownGrace == 0 {
		o.ShutdownGrace = 30 * time.Second
	}
	return o
}

// New builds an Ingester for the Kafka sources that c configures (see
// ConfigFrom). It does not connect to anything until Run.
func New(c Config, opts Options) (*Ingester, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	in := &Ingester{
		conf:      c,
		log:       opts.Logger,
		now:       opts.Now,
		grace:     opts.ShutdownGrace,
		byTopic:   map[string]*source{},
		b:         newBatch(),
		stored:    map[topicPartition]position{},
		resetFrom: map[topicPartition]int64{},
		hwm:       map[topicPartition]int64{},
		reseeked:  map[topicPartition]bool{},
		afterSeek: opts.afterSeek,
		isPaused:  opts.Paused,
		ahead:     aheadHooks{polling: opts.pollingAhead, polled: opts.polledAhead},
		retry:     backoff.Backoff{First: retryFirst, Max: retryMax, Jitter: 0.5},
		paused:    map[topicPartition]pauseKind{},
		checkRows: map[*source]bool{},
		health:    registryHealth{retry: backoff.Backoff{First: registryRetryFirst, Max: registryRetryMax, Jitter: 0.5}},
	}
	in.writes, in.endWrites = context.WithCancel(context.Background())
	if opts.registryRetry != nil {
		in.health.retry = *opts.registryRetry
	}
	reg, err := newRegistry(&c)
	if err != nil {
		return nil, fmt.Errorf("ingest: %w", err)
	}
	in.reg = reg
	in.klog = newKafkaLog(in.log.With("component", "kafka"), opts.kafkaLogEvery)
	in.rlog = newKafkaLog(in.log.With("component", "schema_registry"), opts.kafkaLogEvery)
	in.stallLog = newKafkaLog(in.log.With("component", "ingest"), opts.kafkaLogEvery)
	in.stalls.first = opts.stallRetry
	in.log = in.log.With("component", "ingest")
	var topics, names []string
	for _, s := range c.Sources {
		src, err := newSource(s, in.reg)
		if err != nil {
			return nil, fmt.Errorf("ingest: source %s: %w", s.Name, err)
		}
		src.raw.Log = in.log
		if src.mirror != nil {
			src.mirror.log = in.log
		}
		src.topics = s.Topics
		in.sources = append(in.sources, src)
		names = append(names, s.Name)
		for _, t := range s.Topics {
			in.byTopic[t] = src
			topics = append(topics, t)
		}
	}
	in.m = newMetrics(opts.Registerer, names)
	for _, src := range in.sources {
		for _, t := range src.topics {
			in.m.topicPaused.WithLabelValues(src.name, t).Set(0)
		}
	}
	in.start = kgo.NewOffset().AtStart()
	if c.StartOffset == "latest" {
		in.start = kgo.NewOffset().AtEnd()
	}

	in.sizer = newFetchSizer(c.FetchMaxBytes/fetchConcurrency, c.FetchMaxPartitionBytes)
	auth, kopts, err := clientAuthOptions(c.Connection)
	if err != nil {
		return nil, err
	}
	in.auth, in.klog.auth, auth.log = auth, auth, in.klog
	kopts = append(kopts, netOptions(c.Connection)...)
	kopts = append(kopts,
		kgo.ConsumeTopics(topics...),
		kgo.ConsumerGroup(c.Group),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(in.start),
		kgo.SessionTimeout(c.SessionTimeout),
		kgo.HeartbeatInterval(min(3*time.Second, c.SessionTimeout/3)),
		kgo.RebalanceTimeout(c.RebalanceTimeout),
		kgo.FetchMaxBytes(in.sizer.asked),
		kgo.FetchMaxPartitionBytes(in.sizer.partSize(in.sizer.asked)),
		kgo.MaxConcurrentFetches(fetchConcurrency),
		kgo.FetchMaxWait(fetchMaxWait),
		kgo.MaxDecompressBatchBytes(c.DecompressMaxBytes),
		kgo.AdjustFetchOffsetsFn(in.adjustOffsets),
		kgo.OnPartitionsAssigned(in.onAssigned),
		kgo.OnPartitionsRevoked(in.onRevoked),
		kgo.OnPartitionsLost(in.onLost),
		kgo.WithLogger(in.klog),
		kgo.WithHooks(in.klog, in.sizer),
	)
	kopts = append(kopts, opts.KafkaOpts...)
	clientCtx, stopClient := context.WithCancel(context.Background())
	kopts = append(kopts, kgo.WithContext(clientCtx))
	in.cl, err = kgo.NewClient(kopts...)
	if err != nil {
		stopClient()
		return nil, fmt.Errorf("ingest: kafka client: %w", err)
	}
	in.stopClient = stopClient
	in.sizer.cl.Store(in.cl)
	in.commits = &committer{cl: in.cl, m: in.m, log: in.log, pending: map[topicPartition]kgo.EpochOffset{}}
	return in, nil
}

// LastError returns the last failed write attempt while writes are
// failing, nil once a write succeeds.
func (in *Ingester) LastError() error {
	if p := in.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Run consumes until ctx is cancelled, then writes the batch in flight,
// commits and leaves the group. It returns nil after a clean shutdown.
func (in *Ingester) Run(ctx context.Context) error {
	unwatch := context.AfterFunc(ctx, func() { time.AfterFunc(in.grace, in.endWrites) })
	defer unwatch()
	if err := in.prepare(ctx); err != nil {
		in.closeClient()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	precreated := make(chan struct{})
	go func() {
		defer close(precreated)
		in.precreate(ctx)
	}()
	defer func() { <-precreated }()
	for ctx.Err() == nil {
		if in.flushDue() {
			if err := in.flushDecodingAhead(ctx); err != nil {
				in.backoff(ctx)
			}
			continue // the records decoded ahead may fill the next batch
		}
		in.mu.Lock()
		in.resumeDueLocked()
		in.mu.Unlock()
		in.obeyPauses()
		pollCtx, cancel := ctx, context.CancelFunc(func() {})
		if deadline, ok := in.pollDeadline(); ok {
			pollCtx, cancel = context.WithDeadline(ctx, deadline)
		}
		fetches := in.cl.PollRecords(pollCtx, in.pollRows(in.batchSize()))
		cancel()
		in.absorb(ctx, fetches)
		in.cl.AllowRebalance()
	}
	return in.shutdown()
}

// prepare creates the raw tables and reads the mirrors, retrying while the
// warehouse is down. A source whose table the warehouse refuses stalls
// (stall.go); its writes prepare it later.
func (in *Ingester) prepare(ctx context.Context) error {
	for {
		err := in.ensureTables(ctx)
		if err == nil {
			in.lastErr.Store(nil)
			return nil
		}
		if ctx.Err() != nil || errors.Is(err, raw.ErrPartitioningChanged) {
			return err
		}
		in.log.Warn("cannot prepare raw tables; retrying", "err", err)
		in.mu.Lock()
		in.failedLocked(err)
		in.mu.Unlock()
		in.backoff(ctx)
	}
}

func (in *Ingester) ensureTables(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, in.conf.WriteTimeout)
	defer cancel()
	for _, s := range in.sources {
		if s.prepared {
			continue
		}
		w, err := in.writerLocked(ctx)
		if err != nil {
			return err
		}
		err = w.prepare(ctx, s)
		switch {
		case err == nil:
		case errors.Is(err, raw.ErrPartitioningChanged) || pgerr.Unavailable(err) || ctx.Err() != nil:
			in.dropConnLocked()
			return err
		default:
			in.dropConnLocked()
			in.stallSourceLocked(s, forSource(s, err))
		}
	}
	return nil
}

// shutdown writes the batch in flight within the grace that began with
// the stop, then commits to Kafka and leaves the group within
// leaveTimeout, and closes the client.
func (in *Ingester) shutdown() error {
	ctx := in.writes
	var err error
	for {
		in.mu.Lock()
		err = in.flushLocked(ctx)
		in.mu.Unlock()
		if err == nil || ctx.Err() != nil {
			break
		}
		in.backoff(ctx)
	}
	if err != nil {
		in.log.Error("could not write the last batch before shutdown; its records will be read again", "err", err)
		// Nothing of it was stored, so its partitions' next owner reads
		// it again; dropping it keeps the revoke callback from trying
		// once more while the member leaves.
		in.mu.Lock()
		in.b = newBatch()
		in.mu.Unlock()
	}
	in.closeClient()
	in.mu.Lock()
	in.dropConnLocked()
	in.mu.Unlock()
	in.log.Info("ingester stopped")
	return nil
}

// flushDecodingAhead writes the batch in flight while another goroutine
// polls and decodes up to one more batch, so that fetching and decoding
// overlap the warehouse's work; the decoded records then start the next
// batch (or join this one if its write failed). The rebalance the polls
// block is allowed again once they are in the batch, as after any poll. A
// batch that already holds more than one batch's worth of records (after a
// failed write) is written alone.
//
// The first poll takes only what the client has buffered and is made
// before mu is taken: a poll may wait for a pending rebalance, whose
// callbacks need mu. Only when it returned fetches does the goroutine poll
// on while the write holds mu, since a poll made while an earlier one's
// fetches are held back from the rebalance never waits for it.
func (in *Ingester) flushDecodingAhead(ctx context.Context) error {
	if rows, bytes := in.batchSize(); rows > in.conf.BatchMaxRows || int64(bytes) > in.conf.BatchMaxBytes*3/2 {
		err := in.flush(ctx)
		in.cl.AllowRebalance()
		return err
	}
	// A nil context takes only what is buffered, without waiting.
	fetches := in.cl.PollRecords(nil, in.pollRows(0, 0)) //lint:ignore SA1012 nil means do not wait
	writing, written := context.WithCancel(ctx)
	defer written()
	decoded := make(chan []decodedPart, 1)
	go func() { decoded <- in.decodeAhead(writing, fetches) }()
	var parts []decodedPart
	in.mu.Lock()
	in.stopAhead = func() {
		if decoded != nil {
			written()
			parts, decoded = <-decoded, nil
		}
	}
	clear(in.reseeked)
	err := in.flushLocked(ctx)
	in.stopAhead()
	in.stopAhead = nil
	in.addLocked(parts, in.reseeked)
	in.mu.Unlock()
	in.cl.AllowRebalance()
	return err
}

// flush writes the batch in flight (one attempt, retrying at once only for
// bad rows and vanished partitions).
func (in *Ingester) flush(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.flushLocked(ctx)
}

// flushLocked writes the batch in flight, retrying at once for bad rows
// (the source's rows one by one), vanished partitions, conflicts with
// concurrent transactions and without a source the warehouse refuses
// (stalled); other failures are returned for the caller to back off.
func (in *Ingester) flushLocked(ctx context.Context) error {
	immediate := 0
	for !in.b.empty() {
		err := in.writeOnceLocked(ctx)
		switch {
		case err == nil:
			in.succeededLocked()
			return nil
		case errors.Is(err, errBadRow) && in.checkRowsOf(err):
			in.m.writeErrors.WithLabelValues("bad_row").Inc()
			in.log.Warn("the warehouse rejected a row; checking the source's rows one by one", "err", err)
			continue
		case errors.Is(err, errStoredBefore) && immediate < 5:
			immediate++ // the retry probes: not a write error
			continue
		case errors.Is(err, raw.ErrMissingPartition) && immediate < 5:
			immediate++
			in.m.writeErrors.WithLabelValues("partition").Inc()
			continue
		case errors.Is(err, errRetryNow) && immediate < 5:
			immediate++
			in.m.writeErrors.WithLabelValues("concurrent").Inc()
			continue
		case in.stallLocked(err):
			continue // the batch without the stalled source
		}
		in.failedLocked(err)
		in.m.writeErrors.WithLabelValues("retry").Inc()
		if ctx.Err() == nil {
			in.log.Warn("batch write failed; will retry", "err", err, "attempt", in.retry.Failures(), "records", in.b.len())
		}
		return err
	}
	return nil
}

// checkRowsOf marks the source of err, a row refused, to have its rows
// written one at a time from the next attempt on (every source of the
// batch when err names none). It reports false when they already were:
// the refusal is then the source's, not a row's.
func (in *Ingester) checkRowsOf(err error) bool {
	var se *sourceError
	if errors.As(err, &se) {
		if in.checkRows[se.src] {
			return false
		}
		in.checkRows[se.src] = true
		return true
	}
	added := false
	for _, pb := range in.b.parts {
		if !in.checkRows[pb.source] {
			in.checkRows[pb.source], added = true, true
		}
	}
	return added
}

func (in *Ingester) writeOnceLocked(ctx context.Context) error {
	wctx, cancel := in.writeContext(ctx)
	defer cancel()
	w, err := in.writerLocked(wctx)
	if err != nil {
		return err
	}
	ingestedAt := in.now()
	started := time.Now()
	b := in.b
	res, err := w.write(wctx, b, in.stored, ingestedAt, in.checkRows)
	in.applyConflictsLocked(res.conflicts)
	if errors.Is(err, errCommitUnknown) {
		in.dropConnLocked()
		if err := in.resolveCommitLocked(res.xid, err); err != nil {
			return err
		}
		res.committed = true
	} else if err != nil {
		// An error PostgreSQL reported (one with an SQLSTATE) rolled the
		// transaction back: the connection is fine. Anything else leaves
		// it in an unknown state.
		if pgerr.Code(err) == "" || w.conn.IsClosed() {
			in.dropConnLocked()
		}
		return err
	}
	clear(in.checkRows)
	if res.committed {
		in.resumedLocked(b)
		in.m.commitSeconds.Observe(time.Since(started).Seconds())
		in.m.batchRows.Observe(float64(b.len()))
		commit := map[topicPartition]kgo.EpochOffset{}
		written, dups := map[*source]int{}, map[*source]int{}
		refused := map[topicPartition]int{}
		for _, d := range res.rejected {
			refused[topicPartition{d.rec.Topic, d.rec.Partition}]++
		}
		for tp, pb := range b.parts {
			if pb.skipped > 0 {
				in.m.skipped.WithLabelValues(pb.source.name, decode.SkipTombstone).Add(float64(pb.skipped))
			}
			in.stored[tp] = pb.next
			delete(in.resetFrom, tp)
			written[pb.source] += res.inserted[tp]
			dups[pb.source] += pb.good - refused[tp] - res.inserted[tp]
			commit[tp] = kgo.EpochOffset{Epoch: pb.next.Epoch, Offset: pb.next.Offset}
			if hwm, ok := in.hwm[tp]; ok {
				in.m.lag.WithLabelValues(tp.Topic, partLabel(tp.Partition)).Set(float64(max(0, hwm-pb.next.Offset)))
			}
		}
		for src, n := range written {
			in.m.written.WithLabelValues(src.name).Add(float64(n))
			in.m.duplicates.WithLabelValues(src.name).Add(float64(dups[src]))
		}
		for src, n := range res.idDuplicates {
			in.m.duplicateIDs.WithLabelValues(src.name).Add(float64(n))
		}
		for _, d := range append(append([]deadLetter(nil), b.dead...), res.rejected...) {
			in.m.deadLetters.WithLabelValues(d.src.name, d.rej.Reason).Inc()
		}
		in.commits.add(commit)
	}
	in.b = newBatch()
	return nil
}

// writeContext bounds one attempt of a batch write: by
// warehouse.write_timeout, connecting included, so that a lock wait or a
// stalled server cannot hold the ingester (and its rebalance callbacks)
// indefinitely; by ctx's deadline; and by the shutdown grace, but not by
// a stop itself. A write under way when the ingester stops goes on, its
// commit's answer included: a commit given up on may still succeed (on
// Citus the coordinator shows the batch before the workers confirm), and
// the next attempt would find its own batch stored.
func (in *Ingester) writeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	timeout := in.conf.WriteTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	unwatch := context.AfterFunc(in.writes, cancel)
	return wctx, func() {
		unwatch()
		cancel()
	}
}

// commitCheckTimeout bounds asking the warehouse whether a batch whose
// commit went unanswered was stored.
const commitCheckTimeout = 10 * time.Second

// resolveCommitLocked asks the warehouse, on a new connection, whether
// the batch transaction xid, whose COMMIT went unanswered (lost), committed.
// It returns nil if it did: the batch is stored and counted as written.
// Otherwise it returns lost, and the batch is written again: if the
// warehouse could not tell, the next attempt finds its partitions either
// as they were or already stored, which it treats as another member's
// (fenced, read again from the stored offsets); nothing is stored twice.
// The question is asked within commitCheckTimeout, and after a stop
// within the shutdown grace.
func (in *Ingester) resolveCommitLocked(xid string, lost error) error {
	cctx, cancel := context.WithTimeout(in.writes, commitCheckTimeout)
	defer cancel()
	w, err := in.writerLocked(cctx)
	if err == nil {
		var committed bool
		if committed, err = committedTxn(cctx, w.conn, xid); err == nil {
			if !committed {
				return lost
			}
			in.log.Info("the answer to a batch's commit was lost; the warehouse says it committed",
				"xid", xid, "err", lost)
			return nil
		}
		in.dropConnLocked()
	}
	in.log.Warn("the answer to a batch's commit was lost and the warehouse could not say whether it committed; "+
		"the next attempt finds out", "xid", xid, "err", err)
	return lost
}

// applyConflictsLocked takes note of partitions that another member has
// written: their stored position becomes the truth, and the consumer is
// moved there (kgo ignores partitions it no longer owns).
func (in *Ingester) applyConflictsLocked(conflicts map[topicPartition]position) {
	if len(conflicts) == 0 {
		return
	}
	// The records polled ahead must all come from before the seek: they
	// are dropped with the stale ones and read again from the new position.
	if in.stopAhead != nil {
		in.stopAhead()
	}
	reseek := map[string]map[int32]kgo.EpochOffset{}
	for tp, pos := range conflicts {
		in.m.conflicts.Inc()
		in.log.Warn("partition was already written by another group member; dropping stale records",
			"topic", tp.Topic, "partition", tp.Partition, "stored_offset", pos.Offset)
		in.stored[tp] = pos
		in.reseeked[tp] = true
		if pos.Offset >= 0 {
			if reseek[tp.Topic] == nil {
				reseek[tp.Topic] = map[int32]kgo.EpochOffset{}
			}
			reseek[tp.Topic][tp.Partition] = kgo.EpochOffset{Epoch: pos.Epoch, Offset: pos.Offset}
		}
	}
	if len(reseek) > 0 {
		in.cl.SetOffsets(reseek)
		if in.afterSeek != nil {
			in.afterSeek()
		}
	}
}

// retryFirst and retryMax bound the ingester's waits after failed
// attempts: exponential from retryFirst to retryMax, each shortened by up
// to half at random (Ingester.retry).
const (
	retryFirst = 200 * time.Millisecond
	retryMax   = 5 * time.Second
)

// failedLocked records a failed attempt: LastError reports it (and
// readiness with it), and the next backoff waits longer.
func (in *Ingester) failedLocked(err error) {
	in.retryIn = in.retry.Next()
	in.lastErr.Store(&err)
}

// succeededLocked records a successful attempt after failures: LastError
// is nil again, and the next failure waits retryFirst.
func (in *Ingester) succeededLocked() {
	in.retry.Reset()
	in.lastErr.Store(nil)
}

// backoff sleeps the wait that the last failed attempt was given, cut
// short by ctx.
func (in *Ingester) backoff(ctx context.Context) {
	in.mu.Lock()
	d := in.retryIn
	in.mu.Unlock()
	_ = backoff.Sleep(ctx, d)
}
