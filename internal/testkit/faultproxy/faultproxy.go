// Package faultproxy puts a misbehaving network between the code under
// test and a real server: a TCP proxy for PostgreSQL, or a listener
// wrapper for an in-process Kafka broker (kfake.ListenFn), both of which
// can add latency, stall, leave connections half-open, reset them, or
// refuse new ones, while the test goes on.
//
// The faults model what a hostile network does to a long-lived client:
//
//   - Latency delays every chunk of bytes in both directions.
//   - Stall turns every open and every new connection into a black hole:
//     bytes are accepted and acknowledged by the kernel but nothing is
//     forwarded and nothing comes back. A stalled connection stays so
//     until its client gives up and closes it; only connections opened
//     after Resume work again. The server side of a stalled connection
//     stays open, as it would behind a partition.
//   - HalfOpen closes the server side of every open connection and leaves
//     the client side open and silent: the server has forgotten the
//     session (its locks are released), the client has not.
//   - Reset closes every open connection abruptly (RST) on both sides.
//   - Refuse accepts new connections and resets them at once.
//   - Hold stops, on any connection, the first chunk from the client that
//     holds a given byte string, and everything after it on that
//     connection, until Release: a PostgreSQL message such as COMMIT
//     PREPARED is then sent but never arrives, while the connection
//     stays up.
//
// A client survives these only with deadlines of its own; TCP keepalives
// do not help against a stall here, because the proxy's kernel answers
// them, as a middlebox would.
package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Stats counts what the proxy has seen and done.
type Stats struct {
	Accepted int64 // connections accepted
	Resets   int64 // connections reset by Reset or Refuse
	Stalled  int64 // connections turned into black holes
	HalfOpen int64 // connections left half-open
}

// Proxy forwards connections to a target and injects faults.
type Proxy struct {
	ln     net.Listener
	dial   func() (net.Conn, error) // nil: the proxy wraps a listener
	accept chan net.Conn            // wrapped-listener mode: conns for the server

	mu      sync.Mutex
	conns   map[*link]struct{}
	latency time.Duration
	stalled bool
	refuse  bool
	closed  bool
	// hold is the byte string Hold or HoldReply waits for, nil when
	// nothing is held; holdReply says it is looked for in what the server
	// sends; release is closed by Release; held is closed when a chunk is
	// first held.
	hold          []byte
	holdReply     bool
	release, held chan struct{}

	accepted, resets, stalls, halfOpen atomic.Int64
	wg                                 sync.WaitGroup
}

// link is one client connection and its server side.
type link struct {
	client, server net.Conn
	dead           atomic.Bool // black hole: forward nothing
	once           sync.Once
}

// New starts a proxy on a free loopback port that forwards every
// connection to target (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, conns: map[*link]struct{}{}}
	p.dial = func() (net.Conn, error) { return net.DialTimeout("tcp", target, 5*time.Second) }
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Listen returns a listener for a server that listens through the proxy:
// the server accepts from it, and clients reach it at its Addr, which is
// the real socket's. kfake.ListenFn(faultproxy.Listen(&p)) puts a broker
// behind faults; the broker then advertises the proxied address itself.
func Listen(p **Proxy) func(network, address string) (net.Listener, error) {
	return func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		if err != nil {
			return nil, err
		}
		px := &Proxy{ln: ln, conns: map[*link]struct{}{}, accept: make(chan net.Conn)}
		*p = px
		px.wg.Add(1)
		go px.serve()
		return (*wrapped)(px), nil
	}
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the port clients connect to.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SetLatency delays every chunk forwarded, in both directions, by d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Stall makes every open and every new connection a black hole until
// Resume; open ones stay black holes after it.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = true
	for l := range p.conns {
		if !l.dead.Swap(true) {
			p.stalls.Add(1)
		}
	}
}

// Resume lets new connections through again after Stall or Refuse.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.stalled, p.refuse = false, false
	p.mu.Unlock()
}

// HalfOpen closes the server side of every open connection and leaves
// the client side open and silent.
func (p *Proxy) HalfOpen() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.conns {
		if l.server != nil && !l.dead.Swap(true) {
			p.halfOpen.Add(1)
			_ = l.server.Close()
		}
	}
}

// Reset closes every open connection abruptly.
func (p *Proxy) Reset() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		p.resets.Add(1)
		l.close()
	}
}

// Refuse resets every new connection until Resume.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	p.refuse = true
	p.mu.Unlock()
}

// Hold makes the proxy keep back, on every connection, the first chunk
// sent by the client that contains pattern, and everything the client
// sends after it on that connection, until Release. Held reports when a
// chunk has been kept back.
func (p *Proxy) Hold(pattern []byte) { p.holdFrom(pattern, false) }

// HoldReply is Hold for what the server sends: the first chunk of a reply
// that contains pattern, and everything after it on that connection, is
// kept from the client until Release. A Reset meanwhile loses it, as a
// network that fails after the server has answered does.
func (p *Proxy) HoldReply(pattern []byte) { p.holdFrom(pattern, true) }

func (p *Proxy) holdFrom(pattern []byte, reply bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold, p.holdReply = bytes.Clone(pattern), reply
	p.release, p.held = make(chan struct{}), make(chan struct{})
}

// Held is closed once a chunk is kept back after Hold or HoldReply.
func (p *Proxy) Held() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// Release forwards what Hold or HoldReply kept back (unless its
// connection was reset meanwhile) and stops holding.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.release != nil {
		close(p.release)
	}
	p.hold, p.release = nil, nil
}

// waitHeld blocks while chunk, sent by the client or (fromClient false)
// the server, is to be held back (see Hold and HoldReply).
func (p *Proxy) waitHeld(chunk []byte, fromClient bool) {
	p.mu.Lock()
	if p.hold == nil || p.holdReply == fromClient || !bytes.Contains(chunk, p.hold) {
		p.mu.Unlock()
		return
	}
	release, held := p.release, p.held
	select {
	case <-held:
	default:
		close(held)
	}
	p.mu.Unlock()
	<-release
}

// Open is the number of connections open through the proxy.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{Accepted: p.accepted.Load(), Resets: p.resets.Load(), Stalled: p.stalls.Load(), HalfOpen: p.halfOpen.Load()}
}

// Close stops accepting, closes every connection, and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.Release()
	err := p.ln.Close()
	p.Reset()
	p.wg.Wait()
	return err
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.accept != nil {
				close(p.accept)
			}
			return
		}
		p.accepted.Add(1)
		p.mu.Lock()
		refuse, stalled, closed := p.refuse, p.stalled, p.closed
		p.mu.Unlock()
		if refuse || closed {
			p.resets.Add(1)
			abort(c)
			continue
		}
		l := &link{client: c}
		if stalled {
			l.dead.Store(true)
			p.stalls.Add(1)
		}
		p.wg.Add(1)
		go p.run(l)
	}
}

// run connects l to its server and forwards until either side ends.
func (p *Proxy) run(l *link) {
	defer p.wg.Done()
	if !l.dead.Load() {
		var err error
		if l.server, err = p.connect(); err != nil {
			abort(l.client)
			return
		}
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.close()
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
		l.close()
	}()
	if l.server == nil {
		p.pump(l, nil, l.client, false)
		return
	}
	fromClient, fromServer := make(chan struct{}), make(chan struct{})
	go func() { p.pump(l, l.server, l.client, true); close(fromClient) }()
	go func() { p.pump(l, l.client, l.server, false); close(fromServer) }()
	select {
	case <-fromClient:
	case <-fromServer:
		if l.dead.Load() {
			// Half-open or stalled: the client side lives on, silent,
			// until its owner gives up on it.
			<-fromClient
		}
	}
	// Closing the server side once the client is gone stands for the
	// server's own keepalive noticing, only sooner.
	l.close()
	<-fromClient
	<-fromServer
}

// connect opens the server side: a dial in proxy mode, or an in-memory
// pipe handed to the wrapped listener's Accept.
func (p *Proxy) connect() (net.Conn, error) {
	if p.dial != nil {
		return p.dial()
	}
	a, b := net.Pipe()
	select {
	case p.accept <- b:
		return a, nil
	case <-time.After(10 * time.Second):
		_ = a.Close()
		_ = b.Close()
		return nil, errors.New("faultproxy: server did not accept")
	}
}

// pump copies src to dst until src ends; while the link is dead it reads
// and discards. A nil dst discards everything. fromClient says that src is
// the client (Hold may keep its chunks back) rather than the server
// (HoldReply may).
func (p *Proxy) pump(l *link, dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.waitHeld(buf[:n], fromClient)
		}
		if n > 0 && dst != nil && !l.dead.Load() {
			p.mu.Lock()
			d := p.latency
			p.mu.Unlock()
			if d > 0 {
				time.Sleep(d)
			}
			if !l.dead.Load() {
				if _, werr := dst.Write(buf[:n]); werr != nil && !l.dead.Load() {
					l.close()
					return
				}
			}
		}
		if err != nil {
			if !l.dead.Load() {
				l.close()
			}
			return
		}
	}
}

// close resets both sides once.
func (l *link) close() {
	l.once.Do(func() {
		abort(l.client)
		if l.server != nil {
			abort(l.server)
		}
	})
}

// abort closes c with a reset rather than an orderly FIN where it can.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// wrapped is a Proxy seen as the listener of the server behind it.
type wrapped Proxy

func (w *wrapped) Accept() (net.Conn, error) {
	c, ok := <-w.accept
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}

func (w *wrapped) Close() error   { return (*Proxy)(w).Close() }
func (w *wrapped) Addr() net.Addr { return w.ln.Addr() }
