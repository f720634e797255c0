package smc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bounded"
	"github.com/krcore/krcore/smc"
)

// TestCloseWhilePeerWrites: a connection one side closes while its peer
// goes on writing, neither side closing it otherwise, gives its buffers
// back, and the connections after it (which take those buffers again)
// carry their own bytes whole: none of the old writer's late bytes lands
// in them. Both sides in turn close on a writing peer.
func TestCloseWhilePeerWrites(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: smc.MinBufferSize})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{BufferSize: smc.MinBufferSize})
	ln := listen(t, &smc.Options{Node: srvNode})
	old := bytes.Repeat([]byte("OLD-WRITER-BYTES"), 1<<10)
	for round := range 6 {
		s, c := pair(t, ln, &smc.Options{Node: cliNode})
		if m := settled(t, s); !m.SMC {
			t.Fatalf("round %d: server mode %v, want SMC", round, m)
		}
		closer, writer := s, c
		if round%2 == 1 {
			closer, writer = c, s
		}
		werr := writeFlowing(t, writer, closer, old)
		if err := closer.Close(); err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
		if err := <-werr; err == nil || isTimeout(err) {
			t.Fatalf("round %d: the writer to a closed connection: %v; want it refused", round, err)
		}
		writer.Close()
		carryOwnBytes(t, ln, cliNode)
	}
	t.Logf("srv %+v cli %+v", srvNode.Stats(), cliNode.Stats())
}

// carryOwnBytes makes three connections to ln from node after an earlier
// one ended badly: they take its buffers back (or new ones), and each
// carries its own random bytes both ways, whole and in order.
func carryOwnBytes(t *testing.T, ln net.Listener, node *smc.Node) {
	t.Helper()
	for range 3 {
		s, c := pair(t, ln, &smc.Options{Node: node})
		transfer(t, c, s, 40<<10)
		transfer(t, s, c, 40<<10)
		s.Close()
		c.Close()
	}
}

// serveEchoes echoes every connection ln accepts, each for up to 20 s,
// until the listener closes. The function it returns waits until n
// connections were accepted and every echo ended.
func serveEchoes(ln net.Listener, n int) (wait func() error) {
	var served sync.WaitGroup
	// accepted: one a connection, sent once served counts it.
	accepted := make(chan struct{}, n)
	go func() { // ends when the listener closes
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			served.Go(func() {
				defer s.Close()
				s.SetDeadline(time.Now().Add(20 * time.Second))
				io.Copy(s, s)
			})
			select {
			case accepted <- struct{}{}:
			default: // more than n: not waited for
			}
		}
	}()
	return func() error {
		for range n {
			<-accepted
		}
		served.Wait()
		return nil
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestTCPCutWhileWriting: a connection whose TCP connection is cut (a
// middlebox between the two ends drops it) while one side writes, neither
// side closing it, ends at both sides (the writer's writes and the
// reader's reads fail), and the connections after it carry their own
// bytes whole: the receive buffer whose writer never said it writes no
// more reaches no later connection.
func TestTCPCutWhileWriting(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: smc.MinBufferSize})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{BufferSize: smc.MinBufferSize})
	ln := listen(t, &smc.Options{Node: srvNode})
	mb := newMiddlebox(t, ln.Addr().String())
	old := bytes.Repeat([]byte("OLD-WRITER-BYTES"), 1<<10)
	for round := range 2 {
		s, c := pair(t, viaAddr{ln, mb.ln.Addr()}, &smc.Options{Node: cliNode})
		if m := settled(t, s); !m.SMC {
			t.Fatalf("round %d: server mode %v, want SMC", round, m)
		}
		reader, writer := s, c
		if round == 1 {
			reader, writer = c, s
		}
		werr := writeFlowing(t, writer, reader, old)
		got := make([]byte, 100)
		mb.cut()
		for {
			reader.SetReadDeadline(time.Now().Add(15 * time.Second))
			if _, err := reader.Read(got); err != nil {
				if isTimeout(err) {
					t.Fatalf("round %d: the reader of a cut connection: %v; want it ended", round, err)
				}
				break
			}
		}
		if err := <-werr; err == nil || isTimeout(err) {
			t.Fatalf("round %d: the writer to a cut connection: %v; want it refused", round, err)
		}
		reader.Close()
		writer.Close()
		carryOwnBytes(t, ln, cliNode)
	}
	t.Logf("srv %+v cli %+v", srvNode.Stats(), cliNode.Stats())
}

// writeFlowing starts writing b on w again and again until a write fails
// (its error comes on the channel returned), and returns once r has read
// some of it.
func writeFlowing(t *testing.T, w, r net.Conn, b []byte) <-chan error {
	t.Helper()
	werr := make(chan error, 1)
	go func() { // until its writes fail
		for {
			w.SetWriteDeadline(time.Now().Add(15 * time.Second))
			if _, err := w.Write(b); err != nil {
				werr <- err
				return
			}
		}
	}()
	got := make([]byte, 100)
	r.SetReadDeadline(time.Now().Add(15 * time.Second))
	if _, err := r.Read(got); err != nil {
		t.Fatalf("read of the writer's bytes: %v", err)
	}
	return werr
}

// viaAddr is a listener whose clients dial addr (a middlebox in front of
// it) instead of its own address.
type viaAddr struct {
	net.Listener
	addr net.Addr
}

func (v viaAddr) Addr() net.Addr { return v.addr }

// middlebox relays TCP connections to a target until cut drops them.
type middlebox struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// newMiddlebox relays connections to target until the test ends.
func newMiddlebox(t *testing.T, target string) *middlebox {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mb := &middlebox{ln: ln}
	mb.wg.Add(1)
	go mb.serve(target)
	t.Cleanup(func() {
		ln.Close()
		mb.cut()
		mb.wg.Wait()
	})
	return mb
}

// serve accepts connections and relays each to target; it ends when the
// listener closes.
func (mb *middlebox) serve(target string) {
	defer mb.wg.Done()
	for {
		a, err := mb.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", target)
		if err != nil {
			a.Close()
			continue
		}
		mb.mu.Lock()
		mb.conns = append(mb.conns, a, b)
		mb.mu.Unlock()
		mb.wg.Add(2)
		go mb.relay(a, b)
		go mb.relay(b, a)
	}
}

// relay copies from src to dst until either ends, then closes both.
func (mb *middlebox) relay(dst, src net.Conn) {
	defer mb.wg.Done()
	io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// cut drops every relayed connection.
func (mb *middlebox) cut() {
	mb.mu.Lock()
	cs := mb.conns
	mb.conns = nil
	mb.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// TestShortConnsAnyCloseOrder: many short connections at once, each
// ended another way (the client reads its whole echo and closes first;
// closes right after writing, the server's echo still coming; closes
// mid-read; or half-closes and the server closes first), round after round so that
// buffers are taken again while others end: every echo read whole is
// right, no connection stays open, and both Nodes close within a bound
// (a connection whose end no goroutine saw would hold the Node's Close).
func TestShortConnsAnyCloseOrder(t *testing.T) {
	srvAPI, clients := apis(t)
	for name, api := range clients {
		t.Run(name, func(t *testing.T) { shortConnsAnyCloseOrder(t, srvAPI, api) })
	}
}

func shortConnsAnyCloseOrder(t *testing.T, srvAPI, cliAPI krcore.API) {
	srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: smc.MinBufferSize})
	cliNode := open(t, cliAPI, smc.NodeOptions{BufferSize: smc.MinBufferSize})
	ln := listen(t, &smc.Options{Node: srvNode, HandshakeTimeout: 20 * time.Second})
	const workers, rounds = 8, 6
	echoes := serveEchoes(ln, workers*rounds)
	errs := make(chan error, workers*rounds)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				errs <- shortEcho(ctxT(t), ln.Addr().String(), cliNode, (w+r)%4, w*rounds+r)
			}
		})
	}
	bounded.Within(t, 60*time.Second, "the connections", func() error { wg.Wait(); return nil })
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	bounded.Within(t, 30*time.Second, "the server's echoes", echoes)
	for side, n := range map[string]*smc.Node{"server": srvNode, "client": cliNode} {
		if open := len(n.Conns()); open != 0 {
			t.Errorf("%s: %d connections open after every one closed", side, open)
		}
		bounded.Within(t, 30*time.Second, side+" Node's Close", n.Close)
	}
}

// shortEcho dials addr with node, writes a payload of its own and ends
// the connection the way how says (see TestShortConnsAnyCloseOrder).
func shortEcho(ctx context.Context, addr string, node *smc.Node, how, i int) error {
	c, err := smc.DialContext(ctx, "tcp", addr, &smc.Options{Node: node, HandshakeTimeout: 20 * time.Second})
	if err != nil {
		return fmt.Errorf("dial %d: %w", i, err)
	}
	defer c.Close()
	if m := smc.ModeOf(c); !m.SMC {
		return fmt.Errorf("dial %d: mode %v", i, m)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	want := bytes.Repeat(fmt.Appendf(nil, "conn %d;", i), 200+i*37)
	werr := make(chan error, 1)
	go func() { // ends with the write, the deadline or the Close
		_, err := c.Write(want)
		werr <- err
	}()
	switch how {
	case 1: // close at once, the echo coming
		return nil
	case 2: // close mid-read
		got := make([]byte, len(want)/2)
		if _, err := io.ReadFull(c, got); err != nil {
			return fmt.Errorf("conn %d: read: %w", i, err)
		}
		if !bytes.Equal(got, want[:len(got)]) {
			return fmt.Errorf("conn %d: the echo's first half differs", i)
		}
		return nil
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("conn %d: write: %w", i, err)
	}
	if how == 0 { // read the whole echo and close first
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
			return fmt.Errorf("conn %d: echo (%v), equal %v", i, err, bytes.Equal(got, want))
		}
		return nil
	}
	// Half-close: the server closes first, its close read as EOF.
	if err := c.(*smc.Conn).CloseWrite(); err != nil {
		return fmt.Errorf("conn %d: close write: %w", i, err)
	}
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, want) {
		return fmt.Errorf("conn %d: echo of %d bytes (%v), want %d, equal %v", i, len(got), err, len(want), bytes.Equal(got, want))
	}
	return nil
}
