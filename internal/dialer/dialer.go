// Package dialer makes the TCP dialer of every network connection
// tidemark opens, to PostgreSQL and to Kafka: a bounded dial, TCP
// keepalives, and TCP_USER_TIMEOUT, so that a peer that vanished is
// noticed by the kernel instead of leaving a call blocked forever.
//
// Keepalives find a dead peer on an idle connection; TCP_USER_TIMEOUT
// ends a connection whose sent data stays unacknowledged. Neither helps
// when a middlebox keeps acknowledging while forwarding nothing (a
// stalled proxy or load balancer): only the deadlines of the calls
// themselves end those waits.
package dialer

import (
	"net"
	"time"
)

// Settings of every dialer.
const (
	// DialTimeout bounds one TCP connect (and a DNS lookup before it).
	DialTimeout = 10 * time.Second
	// KeepAliveIdle is the idle time before the first keepalive probe,
	// KeepAliveInterval the time between probes and KeepAliveCount the
	// unanswered probes after which the connection is dead: a silent
	// dead peer is found after about 30s.
	KeepAliveIdle     = 15 * time.Second
	KeepAliveInterval = 5 * time.Second
	KeepAliveCount    = 3
	// UserTimeout is TCP_USER_TIMEOUT: how long sent data may stay
	// unacknowledged before the kernel closes the connection.
	UserTimeout = 30 * time.Second
)

// New returns a dialer with the settings above; timeout replaces
// DialTimeout when positive.
func New(timeout time.Duration) *net.Dialer {
	if timeout <= 0 {
		timeout = DialTimeout
	}
	return &net.Dialer{
		Timeout: timeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: KeepAliveCount,
		},
		Control: control,
	}
}
