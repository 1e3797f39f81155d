package ingest

import "time"

// SetKafkaLogEvery sets how often at most one kind of Kafka client error
// is logged (kafkaLogEvery by default).
func SetKafkaLogEvery(o *Options, every time.Duration) { o.kafkaLogEvery = every }

// SetMergeOnly makes every run of p merge, as after a COPY met a stored
// row, even into an empty mirror and raw table.
func SetMergeOnly(p *Poller) { p.mergeOnly = true }
