package kafka

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
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
// by requestTimeoutOverhead. Every connection uses the dialer of package
// dialer (keepalives, TCP_USER_TIMEOUT): plain TCP ones here, TLS ones
// through the dial function of the TLS options (tlsDialer).
func netOptions(k config.Kafka) []kgo.Opt {
	opts := []kgo.Opt{kgo.RequestTimeoutOverhead(requestTimeoutOverhead)}
	if k.TLS.On() {
		return opts
	}
	return append(opts, kgo.Dialer(dialer.New(dialer.DialTimeout).DialContext))
}

// tlsDialer returns the dial function of TLS connections to brokers: the
// TCP dialer of package dialer, then a handshake with a copy of tc, both
// within dialer.DialTimeout. The copy names the broker's host as the
// server when tc names none, as kgo.DialTLSConfig does; franz-go accepts
// either a dial function or DialTLSConfig, not both.
func tlsDialer(tc *tls.Config) func(ctx context.Context, network, host string) (net.Conn, error) {
	nd := dialer.New(dialer.DialTimeout)
	return func(ctx context.Context, network, host string) (net.Conn, error) {
		c := tc.Clone()
		if c.ServerName == "" {
			server, _, err := net.SplitHostPort(host)
			if err != nil {
				return nil, fmt.Errorf("unable to split host:port for dialing: %w", err)
			}
			c.ServerName = server
		}
		return (&tls.Dialer{NetDialer: nd, Config: c}).DialContext(ctx, network, host)
	}
}
