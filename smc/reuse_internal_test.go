package smc

import (
	"bytes"
	"context"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// connect dials the rig's listener and returns both ends, over SMC.
func (r *acceptRig) connect(t *testing.T, ctx context.Context) (cli, srv *Conn) {
	t.Helper()
	acc := make(chan net.Conn, 1)
	go func() {
		s, _ := r.ln.Accept()
		acc <- s
	}()
	c, err := DialContext(ctx, "tcp", r.ln.Addr().String(), &Options{Node: r.cli})
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	cli, srv = c.(*Conn), s.(*Conn)
	t.Cleanup(func() { cli.Close(); srv.Close() })
	if err := srv.Handshake(ctx); err != nil || !ModeOf(srv).SMC || !ModeOf(cli).SMC {
		t.Fatalf("client %v, server %v, %v", ModeOf(cli), ModeOf(srv), err)
	}
	return cli, srv
}

// rx is a connection's receive buffer and token, as it holds them now.
func (c *Conn) rx() (buffer, uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rmb, c.token
}

// holds reports whether p has slab s, and whether b is free in p.
func (p *bufPool) holds(s *slab, b buffer) (slab, free bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.slabs, s), slices.Contains(p.free, b)
}

// await polls cond every millisecond until it holds or ctx ends.
func await(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("%s: not within the test's time", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReusedBufferIsFresh: a connection closed the normal way (each side
// said it writes no more) gives its receive buffer back, and the next
// connection takes it with a new token and cursors from zero; a
// notification carrying the old token is dropped, not counted as the new
// connection's bytes.
func TestReusedBufferIsFresh(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newAcceptRig(t, ctx)
	cA, sA := r.connect(t, ctx)
	echoBoth(t, cA, sA)
	bufA, tokA := sA.rx()
	cA.Close()
	sA.Close()
	await(t, ctx, "the closed connection's buffer back in its pool", func() bool {
		_, free := bufA.s.pool.holds(bufA.s, bufA)
		return free
	})
	cB, sB := r.connect(t, ctx)
	bufB, tokB := sB.rx()
	if bufB != bufA {
		t.Fatalf("the next connection took %+v, not the free %+v", bufB, bufA)
	}
	if tokB == tokA {
		t.Fatalf("the next connection has the old token %d", tokA)
	}
	sB.mu.Lock()
	prod, cons, base := sB.prod, sB.cons, sB.base
	sB.mu.Unlock()
	if prod != 0 || cons != 0 || base != 0 {
		t.Fatalf("the next connection's cursors prod %d cons %d base %d; want 0", prod, cons, base)
	}
	dropped := r.srv.dropped.Load()
	r.srv.dispatch(&krcore.Message{Write: true, Imm: tokA, From: r.cli.api.Node(), Len: 8})
	if r.srv.dropped.Load() != dropped+1 {
		t.Fatal("a notification with the old token was not dropped")
	}
	sB.mu.Lock()
	prod = sB.prod
	sB.mu.Unlock()
	if prod != 0 {
		t.Fatalf("the old token's notification moved the next connection's producer cursor to %d", prod)
	}
	echoBoth(t, cB, sB)
}

// TestFencedBufferNotReused: a connection released without its peer's
// word that it writes no more (aborted here; also one that lingered, or
// whose confirm never came) fences its receive buffer: no later
// connection gets it or its slab, and once the slab's other buffers are
// back the slab is deregistered, so that the old peer's late RDMA WRITE
// fails instead of landing in a later connection's ring. The same WRITE
// before the abort lands: the test can tell.
func TestFencedBufferNotReused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newAcceptRig(t, ctx)
	cA, sA := r.connect(t, ctx)
	echoBoth(t, cA, sA)
	bufA, _ := sA.rx()
	cA.mu.Lock()
	region, off := cA.peer, cA.peerOff
	cA.mu.Unlock()
	late := r.rawWriter(t, ctx)
	if err := late(region, off); err != nil {
		t.Fatalf("a WRITE into the live connection's buffer: %v", err)
	}

	sA.fail(errAborted) // the peer is told nothing: it may go on WRITEing
	sA.Close()
	await(t, ctx, "the aborted connection released", func() bool {
		b, _ := sA.rx()
		return b.s == nil
	})
	cB, sB := r.connect(t, ctx)
	if bufB, _ := sB.rx(); bufB.s == bufA.s {
		t.Fatalf("the next connection took %+v, in the fenced slab", bufB)
	}
	if has, _ := bufA.s.pool.holds(bufA.s, bufA); has {
		t.Fatal("the fenced slab, with no other buffer out, is still registered")
	}
	if err := late(region, off); err == nil {
		t.Fatal("the old peer's late WRITE into the fenced buffer completed")
	}
	msg := bytes.Repeat([]byte("B's own bytes "), 64)
	if _, err := cB.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	sB.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(sB, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("the next connection read %q, %v; want %q", got, err, msg)
	}
}

// rawWriter returns a function that RDMA WRITEs 8 bytes from the client
// node into region at off, on a queue of its own, and returns the
// completion's error: the old peer's late WRITE.
func (r *acceptRig) rawWriter(t *testing.T, ctx context.Context) func(krcore.Region, uint64) error {
	t.Helper()
	api := r.cli.api
	q, err := api.Queue()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	if err := q.Connect(ctx, r.srv.api.Node(), &krcore.ConnectOptions{Port: r.srv.port}); err != nil {
		t.Fatal(err)
	}
	mr, err := api.RegMR(8, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { api.Deregister(mr) })
	copy(mr.Bytes(), "LATEBYTE")
	id := uint64(0)
	return func(region krcore.Region, off uint64) error {
		id++
		req := krcore.Request{ID: id, Op: verbs.OpWrite, Local: mr.Range(0, 8), Remote: region.At(off)}
		if err := q.PushOne(ctx, true, req); err != nil {
			return err
		}
		var out [1]krcore.Completion
		if _, err := q.PopWait(ctx, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0].Err()
	}
}

// TestPeerClosedFirstAcked: a connection whose peer closed while its
// application keeps it open tells the peer, after ackDelay, that it
// writes no more, so that the peer releases its buffers long before
// linger; its own Close later releases it.
func TestPeerClosedFirstAcked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newAcceptRig(t, ctx)
	cA, sA := r.connect(t, ctx)
	echoBoth(t, cA, sA)
	cA.Close()
	sA.SetReadDeadline(time.Now().Add(10 * time.Second))
	if k, err := sA.Read(make([]byte, 1)); k != 0 || err != io.EOF {
		t.Fatalf("read after the peer's close: %d, %v; want EOF", k, err)
	}
	// The peer's buffers go back once this side said it writes no more
	// (ackDelay), not at linger's end.
	actx, acancel := context.WithTimeout(ctx, linger/2)
	defer acancel()
	await(t, actx, "the closing client released before linger", func() bool {
		b, _ := cA.rx()
		return b.s == nil
	})
	sA.Close()
	await(t, ctx, "the server released at its Close", func() bool {
		b, _ := sA.rx()
		return b.s == nil
	})
}
