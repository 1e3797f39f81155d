package kafka

import "time"

// SetKafkaLogEvery sets how often at most one kind of Kafka client error
// is logged (kafkaLogEvery by default).
func SetKafkaLogEvery(o *Options, every time.Duration) { o.kafkaLogEvery = every }

// SetAfterSeek makes the ingester call f after fencing moved its consumer
// to another member's stored position.
func SetAfterSeek(o *Options, f func()) { o.afterSeek = f }
