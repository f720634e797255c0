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
