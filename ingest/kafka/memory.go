package kafka

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The records an ingester holds are bounded by ingest.memory_max_bytes:
// the fetch the client holds (one at a time, kafka.fetch_max_bytes of
// records in memory), the batch being written and the next one, decoded
// meanwhile (ingest.batch_max_bytes each). A batch's bytes are counted as
// recordBytes and rowBytes count them; a poll takes no more records than
// fit in what is left of the batch's bytes (pollRows).

// RecordOverhead is what a record counts in a batch, and costs in memory, besides its key, value
// and headers while the ingester holds it: the client's kgo.Record (160
// bytes) and the pointer to it, the decoded event in its decoded part and
// again in the batch's row (88 and 104 bytes), the event id's string and
// the allocator's rounding of them.
const RecordOverhead = 448

// fetchConcurrency is how many fetches the client holds at once (in
// flight or read and not yet polled), each of at most kafka.fetch_max_bytes
// divided by it: two, so that a broker with nothing new, which holds a
// fetch for up to fetchMaxWait, does not keep the others waiting.
const fetchConcurrency = 2

// fetchMaxWait is how long a broker may hold a fetch for records to
// arrive: Kafka's own consumer default (fetch.max.wait.ms), not the
// client's 5 s.
const fetchMaxWait = 500 * time.Millisecond

// minFetchBytes is the least a fetch asks for, however well the records
// compress: a fetch returns one record batch at least anyway.
const minFetchBytes = 64 << 10

// fetchSizer keeps the client's fetch within kafka.fetch_max_bytes of
// memory. The client's own limit counts the bytes sent, compressed; a
// fetch's records take more once decompressed and parsed (RecordOverhead
// each). The sizer watches each batch the client reads and asks for fewer
// bytes the more the batches expand: the fetch size is the limit divided
// by the largest expansion seen lately.
type fetchSizer struct {
	limit   int32 // kafka.fetch_max_bytes: a fetch's records in memory
	maxPart int32 // kafka.fetch_max_partition_bytes

	cl atomic.Pointer[kgo.Client]

	mu        sync.Mutex
	expansion float64 // memory per byte fetched: the highest of recent batches, decaying
	asked     int32   // the fetch size last asked for
}

// newFetchSizer starts by asking for minFetchBytes, whose batches say how
// much the records expand before a larger fetch is asked for.
func newFetchSizer(limit, maxPart int32) *fetchSizer {
	f := &fetchSizer{limit: limit, maxPart: maxPart, expansion: 1}
	f.asked = min(minFetchBytes, limit)
	return f
}

// size is the fetch size that keeps a fetch within the limit at the
// current expansion.
func (f *fetchSizer) size() int32 {
	return int32(max(min(float64(f.limit)/f.expansion, float64(f.limit)), min(minFetchBytes, float64(f.limit))))
}

// partSize is the partition bound for a fetch of n bytes.
func (f *fetchSizer) partSize(n int32) int32 { return min(f.maxPart, n) }

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (f *fetchSizer) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	if m.CompressedBytes <= 0 || m.NumRecords <= 0 {
		return
	}
	e := float64(m.UncompressedBytes+m.NumRecords*RecordOverhead) / float64(m.CompressedBytes)
	f.mu.Lock()
	// A larger expansion counts at once; a smaller one lowers it by a
	// hundredth per batch, so that one well-compressed batch among many
	// does not make the next fetch too large.
	f.expansion = max(e, f.expansion*0.99, 1)
	n := f.size()
	changed := math.Abs(float64(n-f.asked)) > float64(f.asked)/8
	if changed {
		f.asked = n
	}
	f.mu.Unlock()
	if cl := f.cl.Load(); changed && cl != nil {
		cl.UpdateFetchMaxBytes(n, f.partSize(n))
	}
}

// pollRows is how many records the next poll may take into a batch that
// holds rows records of bytes bytes: what is left of ingest.batch_max_rows,
// and of ingest.batch_max_bytes at the records' average size lately.
func (in *Ingester) pollRows(rows, bytes int) int {
	n := in.conf.BatchMaxRows - rows
	if avg := in.avgRecordBytes.Load(); avg > 0 {
		n = min(n, int((in.conf.BatchMaxBytes-int64(bytes))/avg)+1)
	}
	return max(n, 1)
}

// noteRecordBytes keeps the average size of the records of parts, as a
// batch counts them, for pollRows.
func (in *Ingester) noteRecordBytes(parts []decodedPart) {
	rows, bytes := 0, 0
	for i := range parts {
		rows += len(parts[i].recs)
		bytes += parts[i].size
	}
	if rows == 0 {
		return
	}
	avg := int64(bytes / rows)
	if old := in.avgRecordBytes.Load(); old > 0 {
		avg = (3*old + avg) / 4
	}
	in.avgRecordBytes.Store(max(avg, 1))
}
