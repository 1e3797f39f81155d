package ingest

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/dialer"
)

// requestTimeoutOverhead is the time a broker has to answer a request
// beyond the request's own timeout (a fetch's max wait, a join's
// rebalance timeout); a connection that stays silent longer is closed and
// the request retried on a new one.
const requestTimeoutOverhead = 10 * time.Second

// netOptions bound the client's network waits: dials, and every request
// by requestTimeoutOverhead. Plain TCP connections use the dialer of
// package dialer (keepalives, TCP_USER_TIMEOUT); with TLS the client dials
// itself, within the same dial timeout.
func netOptions(k config.Kafka) []kgo.Opt {
	opts := []kgo.Opt{kgo.RequestTimeoutOverhead(requestTimeoutOverhead)}
	if k.TLS.On() {
		return append(opts, kgo.DialTimeout(dialer.DialTimeout))
	}
	return append(opts, kgo.Dialer(dialer.New(dialer.DialTimeout).DialContext))
}
