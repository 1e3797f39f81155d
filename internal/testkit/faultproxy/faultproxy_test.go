package faultproxy_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
)

// echoServer answers every line with the same line and reports when a
// connection of its ends.
func echoServer(t *testing.T) (addr string, ended <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ch := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close(); ch <- struct{}{} }()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), ch
}

func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// roundTrip sends a line and reads the answer within timeout.
func roundTrip(c net.Conn, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return errors.New("wrong answer " + line)
	}
	return nil
}

func dial(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestFaults(t *testing.T) {
	// Registered first, so it runs after every other cleanup.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	addr, ended := echoServer(t)
	p := newProxy(t, addr)

	c := dial(t, p)
	if err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	p.SetLatency(150 * time.Millisecond)
	start := time.Now()
	if err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("latency 150ms each way, round trip took %s", d)
	}
	p.SetLatency(0)

	// A stall answers nothing, on open and on new connections; after
	// Resume new connections work and the stalled one stays silent.
	p.Stall()
	var ne net.Error
	if err := roundTrip(c, 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("stalled open connection: want a timeout, got %v", err)
	}
	c2 := dial(t, p)
	if err := roundTrip(c2, 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("new connection during a stall: want a timeout, got %v", err)
	}
	p.Resume()
	if err := roundTrip(c, 300*time.Millisecond); err == nil {
		t.Fatal("a stalled connection answered after Resume")
	}
	_ = c.Close()
	_ = c2.Close()
	waitEnded(t, ended) // the server learns of it once the client gives up
	c3 := dial(t, p)
	if err := roundTrip(c3, 2*time.Second); err != nil {
		t.Fatalf("after Resume: %v", err)
	}

	// Half-open: the server side ends, the client hears nothing.
	p.HalfOpen()
	waitEnded(t, ended)
	if err := roundTrip(c3, 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("half-open: want a timeout, got %v", err)
	}
	_ = c3.Close()

	// Reset: the client's next read fails at once.
	c4 := dial(t, p)
	if err := roundTrip(c4, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Reset()
	if err := roundTrip(c4, 2*time.Second); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("reset: want a connection error, got %v", err)
	}

	// Refused: the proxy accepts and resets at once, so the reset reaches
	// the client either on its first read or while it is still connecting.
	p.Refuse()
	if c5, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Cleanup(func() { _ = c5.Close() })
		if err := roundTrip(c5, 2*time.Second); err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("refused: want a connection error, got %v", err)
		}
	} else if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("refused: want a connection error, got %v", err)
	}
	p.Resume()
	if err := roundTrip(dial(t, p), 2*time.Second); err != nil {
		t.Fatalf("after Refuse and Resume: %v", err)
	}
	st := p.Stats()
	if st.Stalled < 2 || st.HalfOpen < 1 || st.Resets < 2 || st.Accepted < 6 {
		t.Errorf("stats %+v", st)
	}
	_ = p.Close()
}

func waitEnded(t *testing.T, ended <-chan struct{}) {
	t.Helper()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the server's side of the connection did not end")
	}
}

// TestKafkaBehindFaults puts a kfake broker behind the listener wrapper:
// the broker advertises the proxied address, so every connection of a
// client, including those after metadata, goes through the faults.
func TestKafkaBehindFaults(t *testing.T) {
	var p *faultproxy.Proxy
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"), kfake.ListenFn(faultproxy.Listen(&p)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RequestTimeoutOverhead(time.Second),
		kgo.RecordRetries(100), kgo.RetryTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("a")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if p.Stats().Accepted == 0 {
		t.Fatal("the client did not connect through the proxy")
	}
	p.Reset()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("b")}).FirstErr(); err != nil {
		t.Fatalf("after a reset: %v", err)
	}
	if p.Stats().Resets == 0 || p.Stats().Accepted < 2 {
		t.Errorf("stats %+v", p.Stats())
	}
}

func TestMain(m *testing.M) { os.Exit(m.Run()) }

// TestHold: a chunk holding the pattern, and what follows it, arrives
// only after Release; chunks before it and other connections pass.
func TestHold(t *testing.T) {
	addr, _ := echoServer(t)
	p := newProxy(t, addr)
	held, other := dial(t, p), dial(t, p)
	p.Hold([]byte("COMMIT PREPARED"))
	if err := roundTrip(held, 2*time.Second); err != nil {
		t.Fatalf("before the pattern: %v", err)
	}
	if _, err := io.WriteString(held, "COMMIT PREPARED 'x'\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Held():
	case <-time.After(10 * time.Second):
		t.Fatal("the chunk with the pattern was not held")
	}
	if err := roundTrip(other, 2*time.Second); err != nil {
		t.Fatalf("another connection while one is held: %v", err)
	}
	// Nothing comes back while the chunk is held.
	_ = held.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	r := bufio.NewReader(held)
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("the held chunk arrived before Release: %q", line)
	}
	p.Release()
	_ = held.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "COMMIT PREPARED 'x'\n" {
		t.Fatalf("after Release: %q, %v", line, err)
	}
}

// TestHoldReply: the server's reply holding the pattern is kept from the
// client, after the server has taken what the client sent; a Reset
// meanwhile loses it, and the client learns only that its connection
// broke.
func TestHoldReply(t *testing.T) {
	addr, _ := echoServer(t)
	p := newProxy(t, addr)
	t.Cleanup(p.Release)
	c := dial(t, p)
	p.HoldReply([]byte("ANSWER"))
	if err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("before the pattern: %v", err)
	}
	if _, err := io.WriteString(c, "ANSWER\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Held():
	case <-time.After(10 * time.Second):
		t.Fatal("the reply with the pattern was not held")
	}
	p.Reset()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err == nil {
		t.Fatalf("the held reply arrived after a Reset: %q", line)
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the client's connection was not reset")
	}
}
