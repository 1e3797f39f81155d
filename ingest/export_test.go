package ingest

import "time"

// SetKafkaLogEvery sets how often at most one kind of Kafka client error
// is logged (kafkaLogEvery by default).
func SetKafkaLogEvery(o *Options, every time.Duration) { o.kafkaLogEvery = every }

// SetAfterSeek makes the ingester call f after fencing moved its consumer
// to another member's stored position.
func SetAfterSeek(o *Options, f func()) { o.afterSeek = f }

// SetMergeOnly makes every run of p merge, as after a COPY met a stored
// row, even into an empty mirror and raw table.
func SetMergeOnly(p *Poller) { p.mergeOnly = true }
