package smc_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/smc"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// apis starts a two-node cluster and returns node 2's embedded runtime
// and node 1's runtime two ways: embedded, and through krcored.
func apis(t testing.TB) (krcore.API, map[string]krcore.API) {
	others, node1 := testcluster.APIs(t, 2)
	return others[0], node1
}

func open(t testing.TB, api krcore.API, opts smc.NodeOptions) *smc.Node {
	t.Helper()
	n, err := smc.Open(api, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func listen(t testing.TB, opts *smc.Options) *smc.Listener {
	t.Helper()
	ln, err := smc.Listen("tcp", "127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// pair dials ln with opts and returns the accepted and dialled ends.
func pair(t testing.TB, ln net.Listener, opts *smc.Options) (server, clientConn net.Conn) {
	t.Helper()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		acc <- c
	}()
	cc, err := smc.DialContext(ctxT(t), "tcp", ln.Addr().String(), opts)
	if err != nil {
		t.Fatal(err)
	}
	sc := <-acc
	if sc == nil {
		t.FailNow()
	}
	t.Cleanup(func() { cc.Close(); sc.Close() })
	return sc, cc
}

// settled waits for an accepted connection's handshake and returns its mode.
func settled(t testing.TB, c net.Conn) smc.Mode {
	t.Helper()
	if err := c.(*smc.Conn).Handshake(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return smc.ModeOf(c)
}

// transfer writes n random bytes on w, then CloseWrites it, while r reads
// to EOF; it fails the test unless every byte arrives, in order.
func transfer(t testing.TB, w, r net.Conn, n int) {
	t.Helper()
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	errc := make(chan error, 1)
	go func() {
		_, err := w.Write(want)
		if err == nil {
			err = w.(*smc.Conn).CloseWrite()
		}
		errc <- err
	}()
	stop := time.AfterFunc(5*time.Second, func() { t.Logf("stuck: writer %s; reader %s", smc.State(w), smc.State(r)) })
	defer stop.Stop()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read: %v after %d bytes", err, len(got))
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d; equal %v", len(got), len(want), bytes.Equal(got, want))
	}
}

// TestSMC: a connection between node 1 (embedded and through krcored) and
// node 2 runs over SMC and carries streams larger than its buffers both
// ways, with half-closes.
func TestSMC(t *testing.T) {
	srvAPI, clients := apis(t)
	for name, api := range clients {
		t.Run(name, func(t *testing.T) {
			srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: 16 << 10})
			cliNode := open(t, api, smc.NodeOptions{BufferSize: 16 << 10})
			ln := listen(t, &smc.Options{Node: srvNode})
			s, c := pair(t, ln, &smc.Options{Node: cliNode})
			if m := smc.ModeOf(c); !m.SMC {
				t.Fatalf("client mode %v, want SMC", m)
			}
			if m := settled(t, s); !m.SMC {
				t.Fatalf("server mode %v, want SMC", m)
			}
			transfer(t, c, s, 1<<20+7) // wraps the ring, fills the window
			transfer(t, s, c, 300<<10)
		})
	}
}

// TestBidirectional: both ends write large streams at once; neither
// blocks the other for good (each side's reader returns window).
func TestBidirectional(t *testing.T) {
	srvAPI, clients := apis(t)
	api := clients["embedded"]
	srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: smc.MinBufferSize})
	cliNode := open(t, api, smc.NodeOptions{BufferSize: smc.MinBufferSize})
	ln := listen(t, &smc.Options{Node: srvNode})
	s, c := pair(t, ln, &smc.Options{Node: cliNode})
	done := make(chan struct{})
	go func() { defer close(done); transfer(t, s, c, 512<<10) }()
	transfer(t, c, s, 512<<10)
	<-done
}

// TestClose: bytes written before Close all reach the peer, then EOF; a
// write to a closed peer fails with EPIPE, and reads on a closed
// connection with net.ErrClosed.
func TestClose(t *testing.T) {
	srvAPI, clients := apis(t)
	for name, api := range clients {
		t.Run(name, func(t *testing.T) {
			srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: smc.MinBufferSize})
			cliNode := open(t, api, smc.NodeOptions{BufferSize: smc.MinBufferSize})
			ln := listen(t, &smc.Options{Node: srvNode})
			s, c := pair(t, ln, &smc.Options{Node: cliNode})
			msg := bytes.Repeat([]byte("0123456789"), smc.MinBufferSize*7/80) // most of the peer's buffer
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(s)
			if err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("read after the peer's Close: %d bytes, %v", len(got), err)
			}
			deadline := time.Now().Add(5 * time.Second)
			var werr error
			for werr == nil && time.Now().Before(deadline) {
				_, werr = s.Write([]byte("x"))
			}
			if !errors.Is(werr, syscall.EPIPE) {
				t.Fatalf("write to a closed peer: %v, want EPIPE", werr)
			}
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("read after Close: %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestPeerDeath: the server's endpoint dies mid-stream; the client's
// blocked read and write fail with ECONNRESET within a bounded time, after
// the read returned every byte that arrived.
func TestPeerDeath(t *testing.T) {
	srvAPI, clients := apis(t)
	for name, api := range clients {
		t.Run(name, func(t *testing.T) {
			srvNode, err := smc.Open(srvAPI, smc.NodeOptions{BufferSize: smc.MinBufferSize})
			if err != nil {
				t.Fatal(err)
			}
			cliNode := open(t, api, smc.NodeOptions{BufferSize: smc.MinBufferSize})
			ln := listen(t, &smc.Options{Node: srvNode})
			s, c := pair(t, ln, &smc.Options{Node: cliNode})
			settled(t, s)
			if _, err := s.Write([]byte("last words")); err != nil {
				t.Fatal(err)
			}
			werr := make(chan error, 1)
			go func() { // blocks once the server's buffer is full
				_, err := c.Write(make([]byte, 64<<10))
				werr <- err
			}()
			time.Sleep(50 * time.Millisecond) // let the write fill the window (not a cost stand-in)
			start := time.Now()
			srvNode.Close()
			got, err := io.ReadAll(c)
			if string(got) != "last words" || !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("read: %q, %v; want the last words, then ECONNRESET", got, err)
			}
			if err := <-werr; !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("blocked write: %v, want ECONNRESET", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the peer's death took %v to show", d)
			}
		})
	}
}

// TestLinkReuse: later connections between the same two Nodes take
// buffers from slabs already registered and known to the peer: no new
// slab and no new lookup until a slab is full.
func TestLinkReuse(t *testing.T) {
	srvAPI, clients := apis(t)
	for name, api := range clients {
		t.Run(name, func(t *testing.T) {
			srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: smc.MinBufferSize})
			cliNode := open(t, api, smc.NodeOptions{BufferSize: smc.MinBufferSize})
			ln := listen(t, &smc.Options{Node: srvNode})
			for range 5 {
				s, c := pair(t, ln, &smc.Options{Node: cliNode})
				transfer(t, c, s, 10<<10)
			}
			for side, n := range map[string]*smc.Node{"server": srvNode, "client": cliNode} {
				st := n.Stats()
				if st.SMC != 5 || st.Slabs != 1 || st.Lookups != 1 {
					t.Errorf("%s: %d SMC connections, %d slabs, %d lookups; want 5, 1, 1", side, st.SMC, st.Slabs, st.Lookups)
				}
			}
		})
	}
}

// TestSlabsKept: connections that come and go, with fixed buffers and
// with adapting ones at their start size, take buffers from slabs their
// peer knows: no slab is released and looked up again.
func TestSlabsKept(t *testing.T) {
	srvAPI, clients := apis(t)
	for _, opts := range []smc.NodeOptions{{BufferSize: 256 << 10}, {}} {
		srvNode, cliNode := open(t, srvAPI, opts), open(t, clients["embedded"], opts)
		ln := listen(t, &smc.Options{Node: srvNode})
		for range 100 {
			s, c := pair(t, ln, &smc.Options{Node: cliNode})
			settled(t, s)
			c.Close()
			s.Close()
		}
		srv, cli := srvNode.Stats(), cliNode.Stats()
		if srv.SMC != 100 || cli.Lookups > uint64(srv.Slabs) || srv.Lookups > uint64(cli.Slabs) {
			t.Errorf("buffers of %d: %d SMC; client looked up %d slabs of the server's %d, server %d of %d",
				opts.BufferSize, srv.SMC, cli.Lookups, srv.Slabs, srv.Lookups, cli.Slabs)
		}
	}
}

// TestWindowUpdates: a reader taking 64 bytes at a time returns its
// consumer cursor per tenth of its buffer, not per read (RFC 7609).
func TestWindowUpdates(t *testing.T) {
	srvAPI, clients := apis(t)
	const size, total = 16 << 10, 256 << 10
	srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: size})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{BufferSize: size})
	ln := listen(t, &smc.Options{Node: srvNode})
	s, c := pair(t, ln, &smc.Options{Node: cliNode})
	go func() {
		c.Write(make([]byte, total))
		c.(*smc.Conn).CloseWrite()
	}()
	buf := make([]byte, 64)
	got := 0
	for {
		k, err := s.Read(buf)
		got += k
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	st := srvNode.Stats()
	if got != total || st.BytesReceived != total {
		t.Fatalf("read %d bytes, received %d, want %d", got, st.BytesReceived, total)
	}
	if max := uint64(total/(size/10) + 2); st.CursorMsgs == 0 || st.CursorMsgs > max {
		t.Fatalf("%d cursor messages for %d reads of 64 bytes; want 1..%d", st.CursorMsgs, total/64, max)
	}
	t.Logf("%d cursor messages for %d bytes read 64 at a time, %d RDMA writes", st.CursorMsgs, total, cliNode.Stats().Writes)
}

// TestSlabAudience: a connection's receive buffers are exported to its
// peer's endpoint alone: another process of the same node, and another
// node, cannot find them.
func TestSlabAudience(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode := open(t, srvAPI, smc.NodeOptions{})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{})
	ln := listen(t, &smc.Options{Node: srvNode})
	s, c := pair(t, ln, &smc.Options{Node: cliNode})
	settled(t, s)
	name := smc.SlabName(s)
	if name == "" || !smc.ModeOf(c).SMC {
		t.Fatalf("slab %q, mode %v", name, smc.ModeOf(c))
	}
	for who, api := range map[string]krcore.API{"krcored's client on the client's node": clients["daemon"], "the server's own node, as no port": srvAPI} {
		if _, err := api.Region(ctxT(t), 2, name); !errors.Is(err, krcore.ErrNoRegion) {
			t.Errorf("%s looked up the server's slab: %v, want ErrNoRegion", who, err)
		}
	}
	transfer(t, c, s, 64<<10) // the peer still writes into it
}

// TestPortHandedOn: two connections of one Node pair, a reader blocked on
// each; the first reader's bytes come, it returns and reads no more (it
// popped the port, or was handed its bytes), and the second one's bytes
// still reach it: whoever popped for both hands the port on.
func TestPortHandedOn(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: 16 << 10})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{BufferSize: 16 << 10})
	ln := listen(t, &smc.Options{Node: srvNode})
	s1, c1 := pair(t, ln, &smc.Options{Node: cliNode})
	s2, c2 := pair(t, ln, &smc.Options{Node: cliNode})
	for _, s := range []net.Conn{s1, s2} {
		if m := settled(t, s); !m.SMC {
			t.Fatalf("server mode %v, want SMC", m)
		}
	}
	got := make(chan byte, 2)
	for _, s := range []net.Conn{s1, s2} {
		go func() {
			var b [1]byte
			s.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := s.Read(b[:]); err != nil {
				t.Error(err)
			}
			got <- b[0]
		}()
	}
	for i, c := range []net.Conn{c1, c2} {
		if _, err := c.Write([]byte{byte('a' + i)}); err != nil {
			t.Fatal(err)
		}
		if b := <-got; b != byte('a'+i) {
			t.Fatalf("read %q, want %q", b, byte('a'+i))
		}
	}
}

// TestBlockedUntil: a Read waiting for bytes and a Write waiting for
// window (each may be popping the Node's port) end when a deadline set
// while they wait passes, and a Read waiting ends when the connection
// closes.
func TestBlockedUntil(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode := open(t, srvAPI, smc.NodeOptions{BufferSize: 16 << 10})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{BufferSize: 16 << 10})
	ln := listen(t, &smc.Options{Node: srvNode})
	s, c := pair(t, ln, &smc.Options{Node: cliNode})
	if m := settled(t, s); !m.SMC {
		t.Fatalf("server mode %v, want SMC", m)
	}
	errc := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := s.Read(b[:])
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // let it wait
	s.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if err := <-errc; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("blocked read: %v, want a deadline error", err)
	}
	s.SetReadDeadline(time.Time{})

	type result struct {
		n   int
		err error
	}
	wc := make(chan result, 1)
	go func() {
		n, err := c.Write(make([]byte, 1<<20)) // the server reads nothing
		wc <- result{n, err}
	}()
	time.Sleep(20 * time.Millisecond)
	c.SetWriteDeadline(time.Now())
	if r := <-wc; !errors.Is(r.err, os.ErrDeadlineExceeded) || r.n >= 1<<20 {
		t.Fatalf("blocked write: %d bytes, %v; want fewer than all and a deadline error", r.n, r.err)
	}

	rc := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c) // nothing comes: it waits
		rc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	c.Close()
	if err := <-rc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read blocked at Close: %v, want net.ErrClosed", err)
	}
}

// TestBufferSizeOption: connections dialled and accepted with
// Options.BufferSize keep buffers of that size on a Node whose buffers
// adapt, a stream larger than them included; a size below
// MinBufferSize is refused.
func TestBufferSizeOption(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode := open(t, srvAPI, smc.NodeOptions{})
	cliNode := open(t, clients["embedded"], smc.NodeOptions{})
	ln := listen(t, &smc.Options{Node: srvNode, BufferSize: smc.MinBufferSize})
	s, c := pair(t, ln, &smc.Options{Node: cliNode, BufferSize: smc.MinBufferSize})
	if m := settled(t, s); !m.SMC {
		t.Fatalf("server mode %v, want SMC", m)
	}
	transfer(t, c, s, 4<<20)
	for _, n := range []*smc.Node{srvNode, cliNode} {
		for _, ci := range n.Conns() {
			if ci.Mode == "SMC" && (ci.RMB != smc.MinBufferSize || ci.PeerRMB != smc.MinBufferSize) {
				t.Errorf("buffers %d and %d, want %d", ci.RMB, ci.PeerRMB, smc.MinBufferSize)
			}
		}
	}
	_, err := smc.DialContext(ctxT(t), "tcp", ln.Addr().String(), &smc.Options{Node: cliNode, BufferSize: 1000})
	if !errors.Is(err, krcore.ErrInvalid) {
		t.Fatalf("dial with a 1000-byte buffer: %v, want ErrInvalid", err)
	}
}
