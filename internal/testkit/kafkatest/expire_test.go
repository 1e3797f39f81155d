package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestExpireSilentMembers reproduces the member kfake keeps for good: a
// member killed while the coordinator holds its first JoinGroup, waiting
// for an earlier killed member's session to end. When the live member
// that joined next is the leader, it assigns the dead one a partition and
// the group turns stable; without ExpireSilentMembers that partition is
// never consumed again. The leader is chosen by map order, so the test
// repeats the scene until the live member led once.
func TestExpireSilentMembers(t *testing.T) {
	c := NewCluster(t, 2, "events")
	ExpireSilentMembers(t, c)
	var victimJoined sync.Map // group -> chan struct{}
	c.ControlKey(int16(kmsg.JoinGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.JoinGroupRequest)
		if ch, ok := victimJoined.Load(r.Group); ok && strings.HasPrefix(r.MemberID, "victim-") {
			close(ch.(chan struct{}))
			victimJoined.Delete(r.Group)
		}
		return nil, nil, false
	})
	admin, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	// Which member leads is the broker's choice, about even: 24 attempts
	// all missing it would be one chance in sixteen million.
	for attempt := 1; attempt <= 24; attempt++ {
		group := fmt.Sprintf("g%d", attempt)
		joined := make(chan struct{})
		victimJoined.Store(group, joined)

		first := startMember(t, c, group, "first", 3*time.Second)
		first.waitAssigned(t, 2, 10*time.Second)
		first.kill()
		// The group now waits up to three seconds for first's session to
		// end: the victim's JoinGroup is held meanwhile, and it dies.
		victim := startMember(t, c, group, "victim", time.Second)
		select {
		case <-joined:
		case <-time.After(10 * time.Second):
			t.Fatal("the victim's JoinGroup did not arrive")
		}
		// The coordinator holds it: the victim is a member of the group,
		// waiting for the rebalance to complete.
		waitfor.Until(t, "the coordinator to hold the victim's JoinGroup", func() bool { return isMember(t, admin, group, "victim-") })
		victim.kill()
		live := startMember(t, c, group, "live", time.Second)
		n := live.waitAssigned(t, 1, 15*time.Second)
		if n == 2 {
			continue // the victim led and never synced: kfake removed it
		}
		// The live member led and gave the victim a partition.
		live.waitAssigned(t, 2, 15*time.Second)
		return
	}
	t.Fatal("the live member never led the group in 24 attempts")
}

// isMember reports whether the coordinator lists a member of group whose
// ID starts with prefix.
func isMember(t *testing.T, admin *kgo.Client, group, prefix string) bool {
	t.Helper()
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(t.Context(), admin)
	if err != nil {
		return false
	}
	for _, g := range resp.Groups {
		for _, m := range g.Members {
			if strings.HasPrefix(m.MemberID, prefix) {
				return true
			}
		}
	}
	return false
}

// member is a consumer-group member whose connections can be cut at once,
// as a SIGKILL cuts them: it sends nothing more, not even a LeaveGroup.
type member struct {
	mu       sync.Mutex
	conns    []net.Conn
	dead     bool
	assigned map[int32]bool
	changed  chan struct{}
}

func startMember(t *testing.T, c *kfake.Cluster, group, clientID string, session time.Duration) *member {
	t.Helper()
	m := &member{assigned: map[int32]bool{}, changed: make(chan struct{}, 1)}
	var d net.Dialer
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ClientID(clientID),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics("events"),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.SessionTimeout(session),
		kgo.HeartbeatInterval(session/3),
		kgo.RebalanceTimeout(3*time.Second),
		kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.dead {
				return nil, errors.New("killed")
			}
			conn, err := d.DialContext(ctx, network, host)
			if err == nil {
				m.conns = append(m.conns, conn)
			}
			return conn, err
		}),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) { m.update(a, true) }),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, r map[string][]int32) { m.update(r, false) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, l map[string][]int32) { m.update(l, false) }),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
	}()
	t.Cleanup(func() {
		cancel()
		m.kill() // no LeaveGroup: closing must not wait for the cluster
		cl.Close()
	})
	return m
}

func (m *member) update(parts map[string][]int32, add bool) {
	m.mu.Lock()
	for _, p := range parts["events"] {
		if add {
			m.assigned[p] = true
		} else {
			delete(m.assigned, p)
		}
	}
	m.mu.Unlock()
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// waitAssigned waits until m holds at least n partitions and returns how
// many it holds.
func (m *member) waitAssigned(t *testing.T, n int, within time.Duration) int {
	t.Helper()
	deadline := time.After(within)
	for {
		m.mu.Lock()
		have := len(m.assigned)
		m.mu.Unlock()
		if have >= n {
			return have
		}
		select {
		case <-m.changed:
		case <-deadline:
			t.Fatalf("member holds %d partitions after %s, want %d", have, within, n)
		}
	}
}

// kill closes the member's connections and refuses new ones.
func (m *member) kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dead = true
	for _, c := range m.conns {
		_ = c.Close()
	}
}

// TestSilentMembers checks which members the watch drops, state by state.
func TestSilentMembers(t *testing.T) {
	const session = time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type sweep struct {
		at    time.Duration // after t0
		state string
	}
	tests := []struct {
		name   string
		last   kmsg.Key      // the member's last request
		lastAt time.Duration // after t0
		sweeps []sweep       // the last one is checked
		want   bool
	}{
		{"stable, silent", kmsg.Heartbeat, 0, []sweep{{0, "Stable"}, {3 * time.Second, "Stable"}}, true},
		{"stable, heartbeating", kmsg.Heartbeat, 2500 * time.Millisecond, []sweep{{0, "Stable"}, {3 * time.Second, "Stable"}}, false},
		{"stable just now", kmsg.JoinGroup, 0, []sweep{{0, "PreparingRebalance"}, {3 * time.Second, "Stable"}}, false},
		{"stable after a killed first join", kmsg.JoinGroup, 0, []sweep{{0, "PreparingRebalance"}, {time.Second, "Stable"}, {3 * time.Second, "Stable"}}, true},
		{"join held", kmsg.JoinGroup, time.Second, []sweep{{0, "Stable"}, {2 * time.Second, "PreparingRebalance"}, {6 * time.Second, "PreparingRebalance"}}, false},
		{"join answered before this rebalance", kmsg.JoinGroup, 0, []sweep{{0, "PreparingRebalance"}, {time.Second, "Stable"}, {2 * time.Second, "PreparingRebalance"}, {4 * time.Second, "PreparingRebalance"}}, true},
		{"leader killed in its first join", kmsg.JoinGroup, 0, []sweep{{0, "PreparingRebalance"}, {time.Second, "CompletingRebalance"}, {3 * time.Second, "CompletingRebalance"}}, true},
		{"sync held", kmsg.SyncGroup, 0, []sweep{{0, "CompletingRebalance"}, {5 * time.Second, "CompletingRebalance"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &memberWatch{seen: map[string]map[string]memberSeen{"g": {
				"m": {at: t0.Add(tt.lastAt), kind: tt.last, session: session},
			}}, groups: map[string]groupSeen{}}
			var got []string
			for _, s := range tt.sweeps {
				got = w.silent("g", s.state, []string{"m"}, t0.Add(s.at))
			}
			if (len(got) == 1) != tt.want {
				t.Errorf("silent = %v, want dropped %v", got, tt.want)
			}
		})
	}
}
