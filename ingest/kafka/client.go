package kafka

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
)

// clientOptions turns the kafka block into connection options shared by
// every client tidemark makes (the ingester, status, readiness).
func clientOptions(k config.Kafka) ([]kgo.Opt, error) {
	_, opts, err := clientAuthOptions(k)
	return opts, err
}

// clientAuthOptions is clientOptions that also returns the kafkaAuth that
// explains refused connections.
func clientAuthOptions(k config.Kafka) (*kafkaAuth, []kgo.Opt, error) {
	auth, opts, err := newKafkaAuth(k)
	if err != nil {
		return nil, nil, err
	}
	return auth, append([]kgo.Opt{kgo.SeedBrokers(k.Brokers...), kgo.ClientID(k.ClientID)}, opts...), nil
}

// ClientOptions returns the connection options for the configured brokers.
func ClientOptions(k config.Kafka) ([]kgo.Opt, error) {
	opts, err := clientOptions(k)
	return append(opts, netOptions(k)...), err
}

// Ping checks that a broker answers. A connection refused during TLS or
// SASL set-up is reported as an *AuthError that says what failed.
func (in *Ingester) Ping(ctx context.Context) error {
	if err := in.cl.Ping(ctx); err != nil {
		return in.auth.explainPing(err)
	}
	return nil
}

// leaveTimeout bounds the last offset commit to Kafka and leaving the
// group together, on shutdown.
const leaveTimeout = 5 * time.Second

// closeClient makes the last offset commit to Kafka, leaves the group and
// closes the client, in at most about leaveTimeout. The revoke callback
// runs while leaving and finds nothing left to write.
//
// Leaving waits for a JoinGroup or SyncGroup in flight, and the
// coordinator may hold a JoinGroup for up to the rebalance timeout (for
// example while it waits for a member that died to time out). When the
// leave does not finish in time, the client's context is cancelled, which
// fails such a request at once; the group then drops this member when its
// session times out. Nothing is lost either way: positions live in the
// warehouse and were written with the rows.
func (in *Ingester) closeClient() {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	in.commits.final(ctx)
	in.cl.AllowRebalance()
	if err := in.cl.LeaveGroupContext(ctx); err != nil && ctx.Err() != nil {
		in.log.Warn("did not leave the consumer group in time (a join may be in progress); "+
			"the group drops this member after kafka.session_timeout", "err", err)
	}
	in.stopClient()
	in.cl.Close()
}
