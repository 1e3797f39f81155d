package kafka

import (
	"time"

	"github.com/tidemark-dev/tidemark/internal/backoff"
)

// SetKafkaLogEvery sets how often at most one kind of Kafka client error
// is logged (kafkaLogEvery by default).
func SetKafkaLogEvery(o *Options, every time.Duration) { o.kafkaLogEvery = every }

// SetAfterSeek makes the ingester call f after fencing moved its consumer
// to another member's stored position.
func SetAfterSeek(o *Options, f func()) { o.afterSeek = f }

// SetPollingAhead makes the ingester call polling as its polling ahead
// of a batch being written starts a poll that waits for records, with the
// records it holds, and polled when that poll has returned.
func SetPollingAhead(o *Options, polling func(held int), polled func()) {
	o.pollingAhead, o.polledAhead = polling, polled
}

// SetRegistryRetry sets the waits between attempts at an unavailable
// schema registry.
func SetRegistryRetry(o *Options, first, limit time.Duration) {
	o.registryRetry = &backoff.Backoff{First: first, Max: limit}
}

// SetStallRetry sets the first wait before a stalled source is tried
// again (stallRetryFirst by default).
func SetStallRetry(o *Options, first time.Duration) { o.stallRetry = first }
