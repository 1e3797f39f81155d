package kafka

import (
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/raw"
)

// topicPartition names one Kafka partition.
type topicPartition struct {
	Topic     string
	Partition int32
}

// position is a Kafka position: the next offset to read and the leader
// epoch of the last record read (-1 when unknown).
type position struct {
	Offset int64
	Epoch  int32
}

// noPosition marks a partition with no stored position.
var noPosition = position{Offset: -1, Epoch: -1}

// partBatch is what a batch holds for one topic-partition: a contiguous run
// of records from first up to next.
type partBatch struct {
	source       *source
	first        position // position of the first record in the batch
	next         position // position after the last record in the batch
	records      int
	good         int
	dead         int
	skipped      int // records with nothing to load (decode.Event.Skip)
	maxEventTime time.Time
}

// row is one good event and the record it came from.
type row struct {
	src *source
	ev  decode.Event
	rec *kgo.Record
}

// deadLetter is one rejected record.
type deadLetter struct {
	src *source
	rej decode.Rejection
	rec *kgo.Record
}

// batch is the unit of one warehouse transaction.
type batch struct {
	rows  []row
	dead  []deadLetter
	parts map[topicPartition]*partBatch
	// ledger counts rows by source and hour as they are added, so that
	// the write finds the raw partitions and ledger rows it needs
	// without a pass over the rows.
	ledger  raw.Ledger
	bytes   int
	started time.Time
}

func newBatch() *batch {
	return &batch{parts: map[topicPartition]*partBatch{}}
}

func (b *batch) len() int { return len(b.rows) + len(b.dead) }

func (b *batch) empty() bool { return len(b.parts) == 0 }

// add appends a decoded record. Records of one partition arrive in offset
// order, so each partition's records form one contiguous run.
func (b *batch) add(src *source, r *kgo.Record, ev decode.Event, rej *decode.Rejection, now time.Time) {
	if b.empty() {
		b.started = now
	}
	tp := topicPartition{r.Topic, r.Partition}
	pb := b.parts[tp]
	if pb == nil {
		pb = &partBatch{source: src, first: position{r.Offset, r.LeaderEpoch}}
		b.parts[tp] = pb
	}
	pb.next = position{r.Offset + 1, r.LeaderEpoch}
	pb.records++
	if rej != nil {
		b.bytes += recordBytes(r)
		pb.dead++
		b.dead = append(b.dead, deadLetter{src: src, rej: *rej, rec: r})
		return
	}
	if ev.Skip != "" {
		pb.skipped++
		return
	}
	b.bytes += rowBytes(r, &ev)
	pb.good++
	if ev.Time.After(pb.maxEventTime) {
		pb.maxEventTime = ev.Time
	}
	b.rows = append(b.rows, row{src: src, ev: ev, rec: r})
	b.ledger.Add(src.name, ev.Time)
}

// drop removes every record of the given partitions from the batch.
func (b *batch) drop(tps map[topicPartition]bool) {
	if len(tps) == 0 {
		return
	}
	rows := b.rows[:0]
	for _, r := range b.rows {
		if !tps[topicPartition{r.rec.Topic, r.rec.Partition}] {
			rows = append(rows, r)
		}
	}
	clear(b.rows[len(rows):])
	b.rows = rows
	dead := b.dead[:0]
	for _, d := range b.dead {
		if !tps[topicPartition{d.rec.Topic, d.rec.Partition}] {
			dead = append(dead, d)
		}
	}
	clear(b.dead[len(dead):])
	b.dead = dead
	for tp := range tps {
		delete(b.parts, tp)
	}
	b.bytes = 0
	b.ledger.Reset()
	for _, r := range b.rows {
		b.bytes += rowBytes(r.rec, &r.ev)
		b.ledger.Add(r.src.name, r.ev.Time)
	}
	for _, d := range b.dead {
		b.bytes += recordBytes(d.rec)
	}
}

// recordBytes approximates the memory a record holds in a batch: its key,
// value and headers, and RecordOverhead.
func recordBytes(r *kgo.Record) int {
	n := len(r.Value) + len(r.Key) + RecordOverhead
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 40
	}
	return n
}

// rowBytes approximates the memory a good record holds in a batch: the
// record, and what decoding made besides the record's value: the payload
// of a registry format (JSON that may be many times the record's size)
// and a Debezium change's row, old row and key.
func rowBytes(r *kgo.Record, ev *decode.Event) int {
	n := recordBytes(r) + ownBytes(ev.Payload, r.Value)
	if c := ev.Change; c != nil {
		n += ownBytes(c.Row, r.Value) + ownBytes(c.Old, r.Value) + ownBytes(c.Key, r.Value) + len(c.RowKey) + len(c.LSN)
	}
	return n
}

// ownBytes is the length of b unless it lies within value, whose memory
// the record already counts.
func ownBytes(b, value []byte) int {
	if len(b) == 0 {
		return 0
	}
	if len(value) > 0 {
		start := uintptr(unsafe.Pointer(unsafe.SliceData(value)))
		p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if p >= start && p < start+uintptr(cap(value)) {
			return 0
		}
	}
	return len(b)
}
