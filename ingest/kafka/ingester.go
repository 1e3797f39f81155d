package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
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
	// prepared is set once its raw table is made and its mirror read
	// (writer.prepare); guarded by the ingester's mu.
	prepared bool
}

// newSource is the source named name as cfg configures it, for the
// ingester and for a replay of its dead letters alike; reg is the schema
// registry, nil when no source needs it.
func newSource(cfg *config.Config, name string, reg *decode.Registry) (*source, error) {
	sc := cfg.Sources[name]
	dec, err := decode.NewRegistryDecoder(sc, reg)
	if err != nil {
		return nil, err
	}
	if sc.Kind() == config.KindDebezium {
		return &source{name: name, dec: dec, raw: raw.ForSource(cfg, name), mirror: newChangeMirror(name, sc.Mirror, sc.Kafka.Topics, cfg.Distributes(name))}, nil
	}
	return &source{name: name, dec: dec, raw: raw.ForSource(cfg, name), dedupeWindow: sc.DedupeWindow()}, nil
}

// Ingester consumes the configured Kafka sources as one member of the
// consumer group and writes them to the warehouse. See the package
// documentation for its guarantees.
type Ingester struct {
	cfg   *config.Config
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
	start     kgo.Offset
	cl        *kgo.Client
	klog      *kafkaLog // the client's log, rate limited
	auth      *kafkaAuth
	// stopClient cancels the client's context: requests in flight, such
	// as a JoinGroup the coordinator holds open, fail at once.
	stopClient context.CancelFunc

	// mu guards everything below; it is held while a batch is written so
	// that the main loop and the rebalance callbacks never write at once.
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
	afterSeek func() // Options.afterSeek
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

// newRegistry returns the schema registry client when a Kafka source of
// cfg needs one (a Debezium source reads the AvroConverter's records
// through it when it is configured), nil otherwise.
func newRegistry(cfg *config.Config) (*decode.Registry, error) {
	for _, sc := range cfg.Sources {
		if needsRegistry(cfg, sc) {
			return decode.NewRegistry(cfg.SchemaRegistry)
		}
	}
	return nil, nil
}

// needsRegistry reports whether the Kafka source sc reads the schema
// registry: a source of a registry format, or a Debezium source when a
// registry is configured.
func needsRegistry(cfg *config.Config, sc *config.Source) bool {
	return sc.Kind().Kafka() && config.UsesRegistry(sc.Format) || sc.Kind() == config.KindDebezium && cfg.SchemaRegistry.URL != ""
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

// New builds an Ingester for the Kafka sources of cfg. It does not connect
// to anything until Run.
func New(cfg *config.Config, opts Options) (*Ingester, error) {
	opts = opts.withDefaults()
	in := &Ingester{
		cfg:       cfg,
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
	reg, err := newRegistry(cfg)
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
	for _, name := range cfg.SourceNames() {
		sc := cfg.Sources[name]
		if !sc.Kind().Kafka() {
			continue
		}
		src, err := newSource(cfg, name, in.reg)
		if err != nil {
			return nil, fmt.Errorf("ingest: source %s: %w", name, err)
		}
		src.raw.Log = in.log
		if src.mirror != nil {
			src.mirror.log = in.log
		}
		in.sources = append(in.sources, src)
		names = append(names, name)
		for _, t := range sc.Kafka.Topics {
			in.byTopic[t] = src
			topics = append(topics, t)
		}
	}
	if len(in.sources) == 0 {
		return nil, errors.New("ingest: no Kafka sources configured")
	}
	in.m = newMetrics(opts.Registerer, names)
	in.start = kgo.NewOffset().AtStart()
	if cfg.Kafka.StartOffset == "latest" {
		in.start = kgo.NewOffset().AtEnd()
	}

	auth, kopts, err := clientAuthOptions(cfg.Kafka)
	if err != nil {
		return nil, err
	}
	in.auth, in.klog.auth, auth.log = auth, auth, in.klog
	kopts = append(kopts, netOptions(cfg.Kafka)...)
	kopts = append(kopts,
		kgo.ConsumeTopics(topics...),
		kgo.ConsumerGroup(cfg.Kafka.Group),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(in.start),
		kgo.SessionTimeout(cfg.Kafka.SessionTimeout.Duration()),
		kgo.HeartbeatInterval(min(3*time.Second, cfg.Kafka.SessionTimeout.Duration()/3)),
		kgo.RebalanceTimeout(cfg.Kafka.RebalanceTimeout.Duration()),
		kgo.FetchMaxBytes(int32(cfg.Kafka.FetchMaxBytes)),
		kgo.FetchMaxPartitionBytes(int32(cfg.Kafka.FetchMaxPartitionBytes)),
		kgo.AdjustFetchOffsetsFn(in.adjustOffsets),
		kgo.OnPartitionsAssigned(in.onAssigned),
		kgo.OnPartitionsRevoked(in.onRevoked),
		kgo.OnPartitionsLost(in.onLost),
		kgo.WithLogger(in.klog),
		kgo.WithHooks(in.klog),
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
	in.commits = &committer{cl: in.cl, m: in.m, log: in.log, pending: map[topicPartition]kgo.EpochOffset{}}
	return in, nil
}

// clientOptions turns the kafka block into connection options shared by
// every client tidemark makes (the ingester, status, readiness).
func clientOptions(k config.Kafka) ([]kgo.Opt, error) {
	_, opts, err := clientAuthOptions(k)
	return opts, err
}

// clientAuthOptions is clientOptions that also returns the kafkaAuth that
// explains refused connections.
func clientAuthOptions(k config.Kafka) (*kafkaAuth, []kgo.Opt, error) {
	auth, opts, err := newKafkaAuth(k)
	if err != nil {
		return nil, nil, err
	}
	return auth, append([]kgo.Opt{kgo.SeedBrokers(k.Brokers...), kgo.ClientID(k.ClientID)}, opts...), nil
}

// ClientOptions returns the connection options for the configured brokers.
func ClientOptions(k config.Kafka) ([]kgo.Opt, error) {
	opts, err := clientOptions(k)
	return append(opts, netOptions(k)...), err
}

// Ping checks that a broker answers. A connection refused during TLS or
// SASL set-up is reported as an *AuthError that says what failed.
func (in *Ingester) Ping(ctx context.Context) error {
	if err := in.cl.Ping(ctx); err != nil {
		return in.auth.explainPing(err)
	}
	return nil
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
	maxRows := int(in.cfg.Ingest.BatchMaxRows)
	for ctx.Err() == nil {
		if in.flushDue() {
			if err := in.flushDecodingAhead(ctx, maxRows); err != nil {
				in.backoff(ctx)
			}
			continue // the records decoded ahead may fill the next batch
		}
		in.mu.Lock()
		in.resumeDueLocked()
		in.mu.Unlock()
		pollCtx, cancel := ctx, context.CancelFunc(func() {})
		if deadline, ok := in.pollDeadline(); ok {
			pollCtx, cancel = context.WithDeadline(ctx, deadline)
		}
		fetches := in.cl.PollRecords(pollCtx, max(1, maxRows-in.batchLen()))
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
	ctx, cancel := context.WithTimeout(ctx, in.cfg.Warehouse.WriteTimeout.Duration())
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

// leaveTimeout bounds the last offset commit to Kafka and leaving the
// group together, on shutdown.
const leaveTimeout = 5 * time.Second

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

// closeClient makes the last offset commit to Kafka, leaves the group and
// closes the client, in at most about leaveTimeout. The revoke callback
// runs while leaving and finds nothing left to write.
//
// Leaving waits for a JoinGroup or SyncGroup in flight, and the
// coordinator may hold a JoinGroup for up to the rebalance timeout (for
// example while it waits for a member that died to time out). When the
// leave does not finish in time, the client's context is cancelled, which
// fails such a request at once; the group then drops this member when its
// session times out. Nothing is lost either way: positions live in the
// warehouse and were written with the rows.
func (in *Ingester) closeClient() {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	in.commits.final(ctx)
	in.cl.AllowRebalance()
	if err := in.cl.LeaveGroupContext(ctx); err != nil && ctx.Err() != nil {
		in.log.Warn("did not leave the consumer group in time (a join may be in progress); "+
			"the group drops this member after kafka.session_timeout", "err", err)
	}
	in.stopClient()
	in.cl.Close()
}

func (in *Ingester) batchLen() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.b.len()
}

func (in *Ingester) flushDue() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.b.empty() {
		return false
	}
	return in.b.len() >= int(in.cfg.Ingest.BatchMaxRows) ||
		int64(in.b.bytes) >= int64(in.cfg.Ingest.BatchMaxBytes) ||
		!time.Now().Before(in.b.started.Add(in.cfg.Ingest.BatchMaxAge.Duration()))
}

func (in *Ingester) batchDeadline() (time.Time, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.b.empty() {
		return time.Time{}, false
	}
	return in.b.started.Add(in.cfg.Ingest.BatchMaxAge.Duration()), true
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
func (in *Ingester) flushDecodingAhead(ctx context.Context, maxRows int) error {
	if in.batchLen() > maxRows {
		err := in.flush(ctx)
		in.cl.AllowRebalance()
		return err
	}
	// A nil context takes only what is buffered, without waiting.
	fetches := in.cl.PollRecords(nil, maxRows) //lint:ignore SA1012 nil means do not wait
	writing, written := context.WithCancel(ctx)
	defer written()
	decoded := make(chan []decodedPart, 1)
	go func() { decoded <- in.decodeAhead(writing, fetches, maxRows) }()
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

// decodeAhead decodes fetches and, if there were any, goes on polling and
// decoding until it holds a batch's worth of records (ingest.batch_max_rows
// or ingest.batch_max_bytes) or ctx ends with the write. It reads nothing
// that mu guards.
func (in *Ingester) decodeAhead(ctx context.Context, fetches kgo.Fetches, maxRows int) []decodedPart {
	parts := in.decode(ctx, fetches)
	if len(fetches) == 0 {
		return parts
	}
	rows, bytes := 0, 0
	for counted := 0; ; counted = len(parts) {
		for _, d := range parts[counted:] {
			rows += len(d.recs)
			bytes += d.bytes()
		}
		if rows >= maxRows || int64(bytes) >= int64(in.cfg.Ingest.BatchMaxBytes) || ctx.Err() != nil {
			return parts
		}
		if in.ahead.polling != nil {
			in.ahead.polling(rows)
		}
		fetches = in.cl.PollRecords(ctx, maxRows-rows)
		if in.ahead.polled != nil {
			in.ahead.polled()
		}
		parts = append(parts, in.decode(ctx, fetches)...)
	}
}

// bytes approximates the memory d's records take in a batch, decoded.
func (d *decodedPart) bytes() int {
	n := 0
	for i, r := range d.recs {
		if d.rejs[i] != nil {
			n += recordBytes(r)
		} else {
			n += rowBytes(r, &d.evs[i])
		}
	}
	return n
}

// decodedPart is one partition's polled records, decoded.
type decodedPart struct {
	tp   topicPartition
	hwm  int64
	src  *source // nil for a topic of no source
	recs []*kgo.Record
	evs  []decode.Event
	rejs []*decode.Rejection
	// wait, when set, is where the records not decoded begin: they wait
	// for their schema (recs holds only those before).
	wait *pendingPart
	// loss, when set, is a loss of records the client detected at the
	// broker (reset.go); the part holds no records.
	loss *kgo.ErrDataLoss
}

// absorb decodes polled records into the batch.
func (in *Ingester) absorb(ctx context.Context, fetches kgo.Fetches) {
	parts := in.decode(ctx, fetches)
	in.mu.Lock()
	defer in.mu.Unlock()
	in.addLocked(parts, nil)
}

// decode logs the fetch errors and decodes the records, getting the
// schemas of a registry format first (within ctx); it reads nothing that
// mu guards.
func (in *Ingester) decode(ctx context.Context, fetches kgo.Fetches) []decodedPart {
	var parts []decodedPart
	fetches.EachError(func(topic string, partition int32, err error) {
		if dl, ok := dataLoss(err); ok {
			tp := topicPartition{topic, partition}
			parts = append(parts, decodedPart{tp: tp, src: in.byTopic[topic], loss: dl})
			return
		}
		var session *kgo.ErrGroupSession
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) ||
			errors.As(err, &session) { // the client logs why the group session ended
			return
		}
		in.klog.emit(slog.LevelWarn, fmt.Sprintf("fetch\x00%s\x00%d", topic, partition), "fetch error",
			"topic", topic, "partition", partition, "err", err)
	})
	now := in.now()
	// No request for the schemas of one fetch starts after one registry
	// timeout, so that resolving them takes two at most: a poll holds
	// rebalances until its records are decoded. The partitions left
	// waiting are read again at the next poll.
	until := time.Now().Add(in.cfg.SchemaRegistry.Timeout.Duration())
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		d := decodedPart{tp: topicPartition{p.Topic, p.Partition}, hwm: p.HighWatermark, src: in.byTopic[p.Topic]}
		if d.src != nil {
			d.recs = p.Records
			var schemas decode.Schemas
			if d.src.dec.UsesRegistry() && len(p.Records) > 0 {
				var n int
				var pause bool
				schemas, n, pause = in.resolve(ctx, d.src, d.tp, p.Records, until)
				if n < len(p.Records) {
					d.wait = &pendingPart{offset: p.Records[n].Offset}
					if pause {
						d.wait.pause = pausedRegistry
					}
					d.recs = p.Records[:n]
				}
			}
			d.evs, d.rejs = make([]decode.Event, len(d.recs)), make([]*decode.Rejection, len(d.recs))
			for i, r := range d.recs {
				d.evs[i], d.rejs[i] = d.src.dec.DecodeWith(r, now, schemas)
			}
		}
		parts = append(parts, d)
	})
	return parts
}

// addLocked adds decoded records to the batch, skipping those already
// stored and those of the partitions in stale: partitions a write moved to
// another member's stored position after the records were fetched (they
// are read again from there).
func (in *Ingester) addLocked(parts []decodedPart, stale map[topicPartition]bool) {
	now, n := time.Now(), 0
	for _, d := range parts {
		n += len(d.recs)
	}
	in.b.rows = slices.Grow(in.b.rows, n)
	waiting := map[topicPartition]pendingPart{}
	for _, d := range parts {
		in.hwm[d.tp] = d.hwm
		if _, ok := waiting[d.tp]; d.src == nil || stale[d.tp] || ok {
			continue // a partition waiting for a schema takes nothing after the record that waits
		}
		if d.wait != nil {
			waiting[d.tp] = *d.wait
		}
		if d.loss != nil {
			in.dataLossLocked(d.tp, d.loss)
			continue
		}
		floor, owned := in.stored[d.tp]
		from, reset := in.resetFrom[d.tp]
		if owned && floor.Offset >= 0 {
			in.m.lag.WithLabelValues(d.tp.Topic, partLabel(d.tp.Partition)).Set(float64(max(0, d.hwm-floor.Offset)))
		}
		if in.stalls.waiting(d.src) {
			// Its source is stalled: the records wait with their
			// partition, from the first not stored.
			for _, r := range d.recs {
				if !owned || r.Offset >= floor.Offset || reset && r.Offset >= from {
					waiting[d.tp] = pendingPart{offset: r.Offset, pause: pausedStalled}
					break
				}
			}
			continue
		}
		added := 0
		for i, r := range d.recs {
			if owned && r.Offset < floor.Offset && !(reset && r.Offset >= from) {
				continue // already stored; never write a record twice
			}
			rej := d.rejs[i]
			if rej == nil && d.src.mirror != nil {
				rej = d.src.mirror.check(d.evs[i].Change)
			}
			in.b.add(d.src, r, d.evs[i], rej, now)
			added++
		}
		in.m.consumed.WithLabelValues(d.src.name).Add(float64(added))
	}
	in.rewindLocked(waiting)
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
	timeout := in.cfg.Warehouse.WriteTimeout.Duration()
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

func (in *Ingester) writerLocked(ctx context.Context) (*writer, error) {
	if in.w != nil && !in.w.conn.IsClosed() {
		return in.w, nil
	}
	conn, err := in.connect(ctx)
	if err != nil {
		return nil, err
	}
	in.w = &writer{group: in.cfg.Kafka.Group, conn: conn}
	return in.w, nil
}

// connect opens a warehouse connection with the ingester's session
// settings (UTC, so that timestamps read back compare as stored).
func (in *Ingester) connect(ctx context.Context) (*pgx.Conn, error) {
	// The server ends a statement of these sessions that outlives the
	// client's deadline, so that a session the client gave up on does
	// not hold its row locks.
	return pgconnect.Warehouse(ctx, in.cfg.Warehouse.Settings(), "tidemark-ingest",
		map[string]string{"statement_timeout": fmt.Sprintf("%dms", in.cfg.Warehouse.WriteTimeout.Duration().Milliseconds())})
}

// precreateEvery is how often the ingester creates the raw partitions
// around the service clock's present.
const precreateEvery = 30 * time.Minute

// precreate creates raw partitions around the service clock's present
// every precreateEvery, off the write path, until ctx is done. A failure
// waits for the next time: writes create the partitions they need.
func (in *Ingester) precreate(ctx context.Context) {
	job := periodic.Job{
		Name:    "creating upcoming raw partitions",
		Every:   precreateEvery,
		Timeout: in.cfg.Warehouse.WriteTimeout.Duration(),
		Run:     in.precreateOnce,
		Log:     in.log,
	}
	_ = job.Loop(ctx) // no run's error is final
}

// precreateOnce creates the partitions around the present of every
// source's raw table, on a connection of its own.
func (in *Ingester) precreateOnce(ctx context.Context) error {
	conn, err := in.connect(ctx)
	if err != nil {
		return err
	}
	defer pgconnect.Close(ctx, conn)
	var errs []error
	for _, s := range in.sources {
		if err := s.raw.Precreate(ctx, conn, in.now()); err != nil {
			errs = append(errs, fmt.Errorf("source %s: %w", s.name, err))
		}
	}
	return errors.Join(errs...)
}

func (in *Ingester) dropConnLocked() {
	if in.w != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = in.w.conn.Close(ctx)
		cancel()
		in.w = nil
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

// adjustOffsets replaces the offsets Kafka would start from with the ones
// stored in the warehouse: the warehouse commit is the only truth.
func (in *Ingester) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	var stored map[topicPartition]position
	for {
		var err error
		stored, err = in.readStored(ctx, offsets)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, err
		}
		in.log.Warn("cannot read stored offsets; retrying", "err", err)
		in.mu.Lock()
		in.failedLocked(err)
		in.mu.Unlock()
		in.backoff(ctx)
	}
	ends := in.logEnds(ctx, stored)
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.retry.Failures() > 0 {
		in.succeededLocked()
	}
	for topic, parts := range offsets {
		for p := range parts {
			tp := topicPartition{topic, p}
			pos, ok := stored[tp]
			if end, known := ends[tp]; ok && known && pos.Offset > end {
				// The broker's log lost records (reset.go).
				parts[p] = in.start
				in.stored[tp] = pos
				in.resetLocked(tp, OffsetReset{Stored: pos.Offset, LogEnd: end, ResumedAt: "kafka.start_offset (" + in.cfg.Kafka.StartOffset + ")"}, 0)
			} else if ok && pos.Offset >= 0 {
				parts[p] = kgo.NewOffset().At(pos.Offset).WithEpoch(pos.Epoch)
				in.stored[tp] = pos
			} else {
				parts[p] = in.start
				in.stored[tp] = noPosition
			}
			in.log.Debug("resuming partition", "topic", topic, "partition", p, "offset", pos.Offset)
		}
	}
	return offsets, nil
}

const readStoredSQL = `
SELECT topic, partition, next_offset, leader_epoch
FROM tidemark.kafka_offsets
WHERE consumer_group = $1 AND topic = ANY($2)`

func (in *Ingester) readStored(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[topicPartition]position, error) {
	topics := make([]string, 0, len(offsets))
	for t := range offsets {
		topics = append(topics, t)
	}
	// A connection of its own: the writer's belongs to the main loop.
	conn, err := in.connect(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	defer pgconnect.Close(ctx, conn)
	rows, err := conn.Query(cctx, readStoredSQL, in.cfg.Kafka.Group, topics)
	if err != nil {
		return nil, err
	}
	out := map[topicPartition]position{}
	for rows.Next() {
		var tp topicPartition
		var p position
		if err := rows.Scan(&tp.Topic, &tp.Partition, &p.Offset, &p.Epoch); err != nil {
			return nil, err
		}
		out[tp] = p
	}
	return out, rows.Err()
}

func (in *Ingester) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	n := 0
	for _, ps := range assigned {
		n += len(ps)
	}
	in.m.assigned.Add(float64(n))
	in.log.Info("partitions assigned", "partitions", assigned)
}

// onRevoked writes the batch in flight before the partitions go to another
// member. If the warehouse stays unreachable for half the rebalance
// timeout, the revoked partitions' records are dropped from the batch
// instead: nothing of them was stored, so their next owner reads them
// again from the stored offsets.
func (in *Ingester) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	in.mu.Lock()
	defer in.mu.Unlock()
	deadline := time.Now().Add(in.cfg.Kafka.RebalanceTimeout.Duration() / 2)
	fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	for !in.b.empty() {
		if err := in.flushLocked(fctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			in.log.Warn("warehouse unavailable during rebalance; dropping the revoked partitions' unwritten records (they will be read again)")
			break
		}
		// Linear, and short: the rebalance waits for this member.
		_ = backoff.Sleep(fctx, min(time.Duration(in.retry.Failures())*200*time.Millisecond, 2*time.Second))
	}
	in.forgetLocked(revoked)
	in.log.Info("partitions revoked", "partitions", revoked)
}

// onLost drops the lost partitions' unwritten records: another member may
// already own them.
func (in *Ingester) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.forgetLocked(lost)
	if len(lost) > 0 { // the client also calls this with nothing when a group session fails
		in.log.Warn("partitions lost", "partitions", lost)
	}
}

func (in *Ingester) forgetLocked(tps map[string][]int32) {
	drop := map[topicPartition]bool{}
	defer in.resumeLocked(drop)
	for topic, ps := range tps {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			drop[tp] = true
			delete(in.stored, tp)
			delete(in.resetFrom, tp)
			delete(in.hwm, tp)
			in.commits.forget(tp)
			in.m.lag.DeleteLabelValues(topic, partLabel(p))
			in.m.assigned.Dec()
		}
	}
	in.b.drop(drop)
	// A stalled source that this member owned partitions of and owns none
	// of any more is another member's to write, or to find stalled.
	owned := map[*source]bool{}
	for tp := range in.stored {
		owned[in.byTopic[tp.Topic]] = true
	}
	for tp := range drop {
		if src := in.byTopic[tp.Topic]; src != nil && !owned[src] {
			in.endStall(src, "a stalled source's partitions went to other members")
		}
	}
}
