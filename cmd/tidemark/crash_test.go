package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// process is `tidemark run` started as a subprocess.
type process struct {
	cmd    *exec.Cmd
	output *syncbuf.Buffer
	exited chan struct{}
	err    error // valid once exited is closed
}

func startRun(t *testing.T, cfgPath string, clock time.Time) *process {
	t.Helper()
	return startCommand(t, clock, "run", "-c", cfgPath)
}

// startCommand starts the tidemark command with args as a subprocess.
func startCommand(t *testing.T, clock time.Time, args ...string) *process {
	t.Helper()
	return startWith(t, []string{envClock + "=" + clock.Format(time.RFC3339)}, args...)
}

// startWith starts the tidemark command with args as a subprocess, with
// env added to its environment.
func startWith(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), envMain+"=1"), env...)
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start tidemark %s: %v", args[0], err)
	}
	p := &process{cmd: cmd, output: out, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() && out.String() != "" {
			t.Logf("tidemark %s output:\n%s", args[0], out.String())
		}
	})
	return p
}

// TestCrashSafety is acceptance item 2: `tidemark run` is SIGKILLed at
// random moments during a 100k-record stream and restarted each time; the
// raw table ends up exactly the produced set.
func TestCrashSafety(t *testing.T) {
	n, kills := 100_000, 6
	if testing.Short() {
		n, kills = 20_000, 5
	}
	const group, topic = "tidemark-crash", "events"
	pool, dsn := pgtest.NewPool(t)
	kc := kafkatest.NewCluster(t, 4, topic)
	kafkatest.ExpireSilentMembers(t, kc)
	cfgPath := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
log: {level: info}
kafka:
  brokers: [%q]
  group: %s
  session_timeout: 1s
  rebalance_timeout: 2s
ingest: {batch_max_rows: 2000, batch_max_age: 20ms}
sources:
  app_events:
    kafka: {topics: [%s]}
    event_id: /event_id
    event_time: /event_time
    max_age: 30d
`, dsn, kc.ListenAddrs()[0], group, topic))

	now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
	w := ingesttest.Make(topic, n, 4, 7, 0.005, 0.01, now)
	producer := kafkatest.Producer(t, kc, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	// A slow, steady stream: every kill must land while records are
	// still arriving and being written.
	stream := kafkatest.ProduceStream(producer, w.Records, n/100, 250*time.Millisecond)

	midStream := 0
	for _, at := range killWhileStoring(t, cfgPath, now, pool, group, topic, kills, 500*time.Millisecond) {
		if at < int64(n) {
			midStream++
		}
	}
	end, err := stream.Wait()
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
	if midStream < 5 {
		t.Fatalf("only %d of %d kills happened before the stream was fully stored", midStream, kills)
	}

	final := startRun(t, cfgPath, now)
	ingesttest.WaitStored(t, pool, group, topic, end, 5*time.Minute)
	// SIGTERM must find the service running, not still starting up.
	waitfor.Until(t, "the final tidemark run to be assigned partitions", func() bool {
		return strings.Contains(final.output.String(), "partitions assigned")
	})
	stopRun(t, final)

	ingesttest.AssertRaw(t, pool, "app_events", w.Good)
	ingesttest.AssertDeadLetters(t, pool, w)
	ingesttest.AssertStoredEqual(t, pool, group, topic, end)
	ingesttest.AssertLedger(t, pool, "app_events")
}

// killWhileStoring starts `tidemark run` kills times. Each time it waits
// until the process stores records (it has joined the group and been
// assigned partitions), then SIGKILLs it at a random moment within
// maxDelay while it keeps writing. It returns the records stored at each
// kill.
func killWhileStoring(t *testing.T, cfgPath string, now time.Time, pool *pgxpool.Pool, group, topic string, kills int, maxDelay time.Duration) []int64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var stored []int64
	for i := range kills {
		before := storedTotal(t, pool, group, topic)
		p := startRun(t, cfgPath, now)
		waitfor.Within(t, 2*time.Minute, fmt.Sprintf("kill %d: the process to store records", i+1), func() bool {
			return storedTotal(t, pool, group, topic) != before
		})
		time.Sleep(time.Duration(rng.Int64N(int64(maxDelay)))) // the random moment of the kill, not a wait
		at := storedTotal(t, pool, group, topic)
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatalf("kill: %v", err)
		}
		<-p.exited
		t.Logf("kill %d: stored records %d -> %d when killed", i+1, before, at)
		stored = append(stored, at)
	}
	return stored
}

func storedTotal(t *testing.T, pool *pgxpool.Pool, group, topic string) int64 {
	t.Helper()
	var sum int64
	for _, o := range ingesttest.StoredOffsets(t, pool, group, topic) {
		sum += max(o, 0)
	}
	return sum
}

// stopRun stops p as an operator does, with SIGTERM, and requires exit
// code 0 within a minute.
func stopRun(t *testing.T, p *process) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		if p.err != nil {
			t.Errorf("tidemark run after SIGTERM: %v (want exit code 0)", p.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("tidemark run did not stop within a minute of SIGTERM")
	}
}
