package soft

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// stalledPeer accepts one link, answers its hello helloAfter later and
// then never reads again, as a peer whose process hangs with its
// connection open. It returns the peer's address.
func stalledPeer(t *testing.T, helloAfter time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		var f frame
		var hdr [4 + headerLen]byte
		if _, err := readFrame(conn, hdr[:], &f); err == nil {
			time.Sleep(helloAfter) // a slow peer, not a cost
			writeHello(conn, frameHelloAck, 0, ln.Addr().String())
		}
		accepted <- conn
	}()
	t.Cleanup(func() {
		ln.Close()
		if c, ok := <-accepted; ok {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// backedUp is a node whose TCP link to a stalled peer has backed up: its
// queue drains into a socket nobody reads. qps are RC QPs connected to
// the peer over the link (qps[0] filled it with 64 KiB WRITEs) and mr a
// 32 MiB region for their requests; all are closed when the test ends.
type backedUp struct {
	cq  verbs.CQ
	mr  verbs.MR
	qps []verbs.QP
}

// backUpLink makes nqp QPs (QP i on path(i)) on a node of retry timeout
// timeout and backs its link up with the first.
func backUpLink(t *testing.T, timeout time.Duration, nqp int, path func(i int) verbs.Path) *backedUp {
	t.Helper()
	peer := stalledPeer(t, 0)
	n, err := NewNode(Config{Listen: "127.0.0.1:0", RetryTimeout: timeout, TCPOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	pd, _ := n.AllocPD()
	b := &backedUp{qps: make([]verbs.QP, nqp)}
	b.cq, _ = n.CreateCQ(1024)
	blk, err := offheap.Alloc(linkFill)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blk.Close() })
	if b.mr, err = pd.RegMR(blk.Bytes(), verbs.AccessAll); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.mr.Close() }) // an error if the test closed it
	for i := range b.qps {
		q, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: b.cq, RecvCQ: b.cq, Cap: verbs.QPCap{MaxSendWR: linkFill / linkMsg, MaxSendSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Close() })
		if err := verbs.Connect(q, verbs.Endpoint{Addr: peer, QPN: uint32(100 + i)}, path(i)); err != nil {
			t.Fatal(err)
		}
		b.qps[i] = q
	}
	l := n.waitLink(t, peer, b.qps[0], b.wr(verbs.OpWrite))
	if !l.draining {
		t.Fatal("the link's queue never backed up")
	}
	l.wmu.Unlock()
	return b
}

// The bytes that fill a backed-up link, in requests of linkMsg.
const linkFill, linkMsg = 32 << 20, 64 << 10

// wr makes the i-th op of linkMsg bytes, from its slot of b.mr.
func (b *backedUp) wr(op verbs.Opcode) func(int) verbs.SendWR {
	return func(i int) verbs.SendWR {
		return verbs.SendWR{ID: uint64(i), Op: op, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(b.mr, (i%(linkFill/linkMsg))*linkMsg, linkMsg)}, RemoteAddr: 1 << 20, RKey: 1}
	}
}

// TestHeldOffRequestsTimeOut: a QP whose pump holds off because the link's
// queue cannot drain (the peer stopped reading) still times out with
// RETRY_EXC_ERR, though none of its requests reached the wire; the MR
// the queued requests came from deregisters at once (the queue holds no
// registered memory), and nothing hangs.
func TestHeldOffRequestsTimeOut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	// The QP filling the link must not time out before it has: a shared
	// machine may take long to dial and write 32 MiB.
	b := backUpLink(t, timeout, 2, func(i int) verbs.Path {
		if i == 0 {
			return verbs.Path{Timeout: 5 * time.Second, RetryCount: 1}
		}
		return verbs.Path{}
	})
	qps, cq, mr := b.qps, b.cq, b.mr
	if _, err := qps[1].PostSend([]verbs.SendWR{b.wr(verbs.OpWrite)(0)}); err != nil {
		t.Fatal(err)
	}
	q1 := qps[1].(*qp)
	q1.mu.Lock()
	sent := q1.sent
	q1.mu.Unlock()
	if sent != 0 {
		t.Fatalf("the second QP sent %d requests on a backlogged link, want it held off", sent)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*timeout)
	defer cancel()
	wc := make([]verbs.WC, 64)
	for failed := false; !failed; {
		k, err := cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range wc[:k] {
			if c.QPN != qps[1].Num() {
				t.Fatalf("completion %+v of the QP filling the link, before its timeout", c)
			}
			if c.Status != verbs.RetryExcErr {
				t.Fatalf("held-off request completed %+v, want RETRY_EXC_ERR", c)
			}
			failed = true
		}
		if k == 0 {
			if err := cq.Wait(ctx); err != nil {
				t.Fatalf("no completion for the held-off request: %v", err)
			}
		}
	}
	done := make(chan error, 1)
	go func() {
		for _, q := range qps {
			q.Close()
		}
		done <- mr.Close()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("deregistering the MR hangs while the link is stalled")
	}
}

// waitLink posts every request wr makes for q's send queue at once and
// waits (5 s at most) until the TCP link to peer is up and its queue
// draining; it returns the link with its wmu held.
func (n *Node) waitLink(t *testing.T, peer string, q verbs.QP, wr func(int) verbs.SendWR) *tcpLink {
	t.Helper()
	wrs := make([]verbs.SendWR, q.(*qp).cap.MaxSendWR)
	for i := range wrs {
		wrs[i] = wr(i)
	}
	if _, err := q.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		n.linkMu.Lock()
		l := n.tcp[peer]
		n.linkMu.Unlock()
		if l != nil {
			l.wmu.Lock()
			if l.draining || time.Now().After(end) {
				return l
			}
			l.wmu.Unlock()
		}
	}
}

// TestReadNotHeldOff: on a link whose queue drains into a socket nobody
// reads, a READ goes out at once, queued behind what is there, where a
// WRITE holds off until the queue is empty (TestHeldOffRequestsTimeOut). A
// READ is a header: holding off saves copying no payload, and a READ
// held could wait as long as the link's reader kept queueing responses to
// the peer's own READs (both nodes READing each other 128 deep: held for
// the whole 10 s retry timeout, TestTCPManyLargeReads at nice 19).
func TestReadNotHeldOff(t *testing.T) {
	b := backUpLink(t, time.Minute, 3, func(int) verbs.Path { return verbs.Path{} })
	qps := b.qps
	for i, op := range []verbs.Opcode{verbs.OpWrite, verbs.OpRead} {
		q := qps[1+i]
		if _, err := q.PostSend([]verbs.SendWR{b.wr(op)(0)}); err != nil {
			t.Fatal(err)
		}
		q.(*qp).mu.Lock()
		sent := q.(*qp).sent
		q.(*qp).mu.Unlock()
		if want := uint64(i); sent != want {
			t.Errorf("%v on a backlogged link: %d sent, want %d", op, sent, want)
		}
	}
}
