package smc_test

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
	"time"

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
		werr := make(chan error, 1)
		go func() { // the old writer: until its writes fail
			for {
				writer.SetWriteDeadline(time.Now().Add(15 * time.Second))
				if _, err := writer.Write(old); err != nil {
					werr <- err
					return
				}
			}
		}()
		got := make([]byte, 100)
		closer.SetReadDeadline(time.Now().Add(15 * time.Second))
		if _, err := closer.Read(got); err != nil {
			t.Fatalf("round %d: read of the writer's bytes: %v", round, err)
		}
		if err := closer.Close(); err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
		if err := <-werr; err == nil || isTimeout(err) {
			t.Fatalf("round %d: the writer to a closed connection: %v; want it refused", round, err)
		}
		writer.Close()
		// The next connections take the buffers back: each carries its
		// own random bytes both ways, whole and in order.
		for range 3 {
			s2, c2 := pair(t, ln, &smc.Options{Node: cliNode})
			transfer(t, c2, s2, 40<<10)
			transfer(t, s2, c2, 40<<10)
			s2.Close()
			c2.Close()
		}
	}
	t.Logf("srv %+v cli %+v", srvNode.Stats(), cliNode.Stats())
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
		werr := make(chan error, 1)
		go func() { // the old writer: until its writes fail
			for {
				writer.SetWriteDeadline(time.Now().Add(15 * time.Second))
				if _, err := writer.Write(old); err != nil {
					werr <- err
					return
				}
			}
		}()
		got := make([]byte, 100)
		reader.SetReadDeadline(time.Now().Add(15 * time.Second))
		if _, err := reader.Read(got); err != nil {
			t.Fatalf("round %d: read of the writer's bytes: %v", round, err)
		}
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
		for range 3 {
			s2, c2 := pair(t, ln, &smc.Options{Node: cliNode})
			transfer(t, c2, s2, 40<<10)
			transfer(t, s2, c2, 40<<10)
			s2.Close()
			c2.Close()
		}
	}
	t.Logf("srv %+v cli %+v", srvNode.Stats(), cliNode.Stats())
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
