package ingest

import "time"

// SetKafkaLogEvery sets how often at most one kind of Kafka client error
// is logged (kafkaLogEvery by default).
func SetKafkaLogEvery(o *Options, every time.Duration) { o.kafkaLogEvery = every }
