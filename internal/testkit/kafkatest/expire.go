package kafkatest

import (
	"context"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ExpireSilentMembers makes c drop a consumer-group member that has sent
// nothing for twice its session timeout and is not waiting for an answer
// the coordinator holds, as a Kafka broker drops it after one session
// timeout.
//
// kfake arms a member's session timer only when its JoinGroup or
// SyncGroup response is delivered, and ends a rebalance a member never
// finishes only after the rebalance timeout. A process killed while the
// coordinator held its first JoinGroup (for example while the group waited
// for an earlier killed member's session to end) never receives the
// response: if it was made the leader, the group waits the whole rebalance
// timeout for its assignments; if another member leads and gives it
// partitions, kfake keeps it, and nothing ever consumes those partitions
// again. Tests that SIGKILL group members call this so that the broker
// they run against behaves as Kafka does. Members kfake expires itself are
// gone long before twice their session timeout, so this changes nothing
// else.
func ExpireSilentMembers(tb testing.TB, c *kfake.Cluster) {
	tb.Helper()
	w := &memberWatch{seen: map[string]map[string]memberSeen{}, groups: map[string]groupSeen{}}
	for _, key := range []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.OffsetCommit, kmsg.LeaveGroup} {
		c.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			w.observe(req, time.Now())
			return nil, nil, false // the cluster answers it as usual
		})
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		tb.Fatalf("kafkatest: client: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			w.sweep(ctx, cl, tb)
		}
	}()
	// Runs before the cluster closes (cleanups run last-added first).
	tb.Cleanup(func() {
		cancel()
		<-done
		cl.Close()
	})
}

// memberSeen is the last group request a member sent, when, and its
// session timeout.
type memberSeen struct {
	at      time.Time
	kind    kmsg.Key
	session time.Duration
}

// groupSeen is what the sweeps saw of a group: its state and members
// since when, and when it was last seen out of PreparingRebalance.
type groupSeen struct {
	state, members   string
	since            time.Time
	outsidePreparing time.Time
}

// memberWatch is what ExpireSilentMembers knows of the groups: the
// requests it saw and the states the sweeps saw.
type memberWatch struct {
	mu     sync.Mutex
	seen   map[string]map[string]memberSeen // group -> member ID -> last request
	groups map[string]groupSeen
}

func (w *memberWatch) observe(req kmsg.Request, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	note := func(group, member string) {
		if member == "" {
			return
		}
		if w.seen[group] == nil {
			w.seen[group] = map[string]memberSeen{}
		}
		s := w.seen[group][member]
		s.at, s.kind = now, kmsg.Key(req.Key())
		if j, ok := req.(*kmsg.JoinGroupRequest); ok {
			s.session = time.Duration(j.SessionTimeoutMillis) * time.Millisecond
		}
		w.seen[group][member] = s
	}
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		note(r.Group, r.MemberID)
	case *kmsg.SyncGroupRequest:
		note(r.Group, r.MemberID)
	case *kmsg.HeartbeatRequest:
		note(r.Group, r.MemberID)
	case *kmsg.OffsetCommitRequest:
		note(r.Group, r.MemberID)
	case *kmsg.LeaveGroupRequest:
		delete(w.seen[r.Group], r.MemberID)
		for _, m := range r.Members {
			delete(w.seen[r.Group], m.MemberID)
		}
	}
}

// silent takes note of a group described as state with members and
// returns the members a broker would have dropped: those that have sent
// nothing for twice their session timeout, while the group has been in
// this state with these members for a session timeout (time for a live
// member to answer a change), and that are not waiting for a JoinGroup
// the coordinator holds while it prepares a rebalance or a SyncGroup it
// holds while the rebalance completes.
func (w *memberWatch) silent(group, state string, members []string, now time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	sort.Strings(members)
	g := w.groups[group]
	if key := strings.Join(members, ","); g.state != state || g.members != key {
		g.state, g.members, g.since = state, key, now
	}
	if state != "PreparingRebalance" {
		g.outsidePreparing = now
	}
	w.groups[group] = g
	var out []string
	for _, m := range members {
		s, ok := w.seen[group][m]
		switch {
		case !ok || s.session == 0:
			// Joined before the watch began: kfake's own timer holds.
		case state == "PreparingRebalance" && s.kind == kmsg.JoinGroup && s.at.After(g.outsidePreparing):
			// Its JoinGroup is held until the rebalance completes.
		case state == "CompletingRebalance" && s.kind == kmsg.SyncGroup:
			// Its SyncGroup is held until the leader's arrives.
		case now.Sub(s.at) > 2*s.session && now.Sub(g.since) > s.session:
			out = append(out, m)
		}
	}
	return out
}

// sweep describes every group the watch has seen and removes its silent
// members, as their session timing out would.
func (w *memberWatch) sweep(ctx context.Context, cl *kgo.Client, tb testing.TB) {
	w.mu.Lock()
	groups := make([]string, 0, len(w.seen))
	for g := range w.seen {
		groups = append(groups, g)
	}
	w.mu.Unlock()
	if len(groups) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = groups
	resp, err := req.RequestWith(rctx, cl)
	if err != nil {
		return // tried again at the next tick
	}
	for _, g := range resp.Groups {
		if g.ErrorCode != 0 {
			continue
		}
		members := make([]string, len(g.Members))
		for i, m := range g.Members {
			members[i] = m.MemberID
		}
		silent := w.silent(g.Group, g.State, members, time.Now())
		if len(silent) == 0 {
			continue
		}
		leave := kmsg.NewPtrLeaveGroupRequest()
		leave.Group = g.Group
		for _, m := range silent {
			lm := kmsg.NewLeaveGroupRequestMember()
			lm.MemberID = m
			leave.Members = append(leave.Members, lm)
		}
		if _, err := leave.RequestWith(rctx, cl); err == nil && ctx.Err() == nil {
			tb.Logf("kafkatest: group %s: removed members silent for twice their session timeout and not waiting for an answer: %v", g.Group, silent)
		}
	}
}
