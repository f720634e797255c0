package soft

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// TestTimerRestartsOnProgress: the transport timer measures time without
// progress, as on an RNIC. Two WRITEs go out together on a QP whose
// timeout is T; a hand-played peer ACKs the first at T/2 and the second at
// 1.1T, more than T after it went out but well within T of the first ACK.
// Both complete SUCCESS. Timed from its own transmission, the second
// failed RETRY_EXC_ERR at T, though the peer was answering.
func TestTimerRestartsOnProgress(t *testing.T) {
	const timeout = 4 * time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	reqs := make(chan frame, 2)
	conns := make(chan net.Conn, 1)
	go func() { // the peer: accept the hello, answer it, pass the requests on
		defer close(reqs)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		conns <- conn
		var f frame
		var hdr [4 + headerLen]byte
		if _, err := readFrame(conn, hdr[:], &f); err != nil {
			return
		}
		writeHello(conn, frameHelloAck, 0, ln.Addr().String())
		for range 2 {
			if _, err := readFrame(conn, hdr[:], &f); err != nil {
				return
			}
			reqs <- f
		}
	}()
	n, err := NewNode(Config{RetryTimeout: timeout, TCPOnly: true}) // the sweep looks every 100 ms
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	pd, _ := n.AllocPD()
	cq, _ := n.CreateCQ(16)
	blk, err := offheap.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blk.Close() })
	mr, err := pd.RegMR(blk.Bytes(), verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close(); mr.Close() })
	if err := verbs.Connect(q, verbs.Endpoint{Addr: ln.Addr().String(), QPN: 100}, verbs.Path{Timeout: timeout / 4, RetryCount: 3}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	wr := verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(mr, 0, 8)}, RemoteAddr: 4096, RKey: 1}
	wr2 := wr
	wr2.ID = 1
	if _, err := q.PostSend([]verbs.SendWR{wr, wr2}); err != nil {
		t.Fatal(err)
	}
	conn := <-conns
	t.Cleanup(func() { conn.Close() })
	for i, at := range []time.Duration{timeout / 2, timeout * 11 / 10} {
		f, ok := <-reqs
		if !ok {
			t.Fatalf("the link ended before request %d", i)
		}
		time.Sleep(time.Until(start.Add(at))) // the peer answers late
		ack := frame{typ: frameResponse, op: f.op, syn: synAck, dstQPN: f.srcQPN, srcQPN: f.dstQPN, psn: f.psn, gen: f.gen}
		var hdr [4 + headerLen]byte
		ack.putHeader(hdr[:], 0)
		if _, err := conn.Write(hdr[:]); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wc [2]verbs.WC
	for got := 0; got < 2; {
		k, err := cq.Poll(wc[:2-got])
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range wc[:k] {
			if c.ID != uint64(got) || c.Status != verbs.Success {
				t.Fatalf("completion %+v, want WRITE %d SUCCESS", c, got)
			}
			got++
		}
		if k == 0 {
			if err := cq.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestMemWireOwnTime: over the in-memory wire a request is served, and its
// response landed, inside its pump's send, so the time that takes is the
// requester's own: a 64 MiB READ, a copy of several milliseconds, on a QP
// whose timeout is 2 ms completes SUCCESS. The sweep failed it
// RETRY_EXC_ERR mid-copy, as it did a READ whose goroutine was descheduled
// there (krbench demo's mesh under -race at load 35). A READ from a node
// that has gone still fails RETRY_EXC_ERR.
func TestMemWireOwnTime(t *testing.T) {
	const size = 64 << 20
	fab := NewFabric()
	var sides [2]struct {
		n  *Node
		q  verbs.QP
		cq verbs.CQ
		mr verbs.MR
	}
	for i := range sides {
		s := &sides[i]
		var err error
		if s.n, err = fab.NewNode(Config{RetryTimeout: 8 * time.Millisecond}); err != nil { // the sweep looks every 1 ms
			t.Fatal(err)
		}
		t.Cleanup(func() { s.n.Close() })
		pd, _ := s.n.AllocPD()
		s.cq, _ = s.n.CreateCQ(16)
		blk, err := offheap.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { blk.Close() })
		if s.mr, err = pd.RegMR(blk.Bytes(), verbs.AccessAll); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.mr.Close() })
		if s.q, err = pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.q.Close() })
	}
	x, y := &sides[0], &sides[1]
	path := verbs.Path{Timeout: time.Millisecond, RetryCount: 1}
	if err := verbs.Connect(x.q, y.q.Endpoint(), path); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(y.q, x.q.Endpoint(), path); err != nil {
		t.Fatal(err)
	}
	read := func(id uint64) verbs.WC {
		wr := verbs.SendWR{ID: id, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, size)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}
		if _, err := x.q.PostSend([]verbs.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wc [1]verbs.WC
		for {
			if k, err := x.cq.Poll(wc[:]); err != nil || k == 1 {
				if err != nil {
					t.Fatal(err)
				}
				return wc[0]
			}
			if err := x.cq.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range uint64(3) {
		if wc := read(i); wc.Status != verbs.Success {
			t.Fatalf("64 MiB READ %d over the in-memory wire: %+v, want SUCCESS", i, wc)
		}
	}
	y.n.Close()
	if wc := read(3); wc.Status != verbs.RetryExcErr {
		t.Fatalf("READ from a closed node: %+v, want RETRY_EXC_ERR", wc)
	}
}
