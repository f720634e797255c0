package soft

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// stalledPeer accepts one link, answers its hello and then never reads
// again, as a peer whose process hangs with its connection open. It
// returns the peer's address.
func stalledPeer(t *testing.T) string {
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

// TestHeldOffRequestsTimeOut: a QP whose pump holds off because the link's
// queue cannot drain (the peer stopped reading) still times out with
// RETRY_EXC_ERR, though none of its requests reached the wire; the QP
// that filled the link does too, every MR deregisters at once (the queue
// holds no registered memory), and nothing hangs.
func TestHeldOffRequestsTimeOut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	peer := stalledPeer(t)
	n, err := NewNode(Config{Listen: "127.0.0.1:0", RetryTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	pd, _ := n.AllocPD()
	cq, _ := n.CreateCQ(1024)
	const size, msg = 32 << 20, 64 << 10
	blk, err := offheap.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer blk.Close()
	mr, err := pd.RegMR(blk.Bytes(), verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	var qps [2]verbs.QP
	for i := range qps {
		qps[i], err = pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: size / msg, MaxSendSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := verbs.Connect(qps[i], verbs.Endpoint{Addr: peer, QPN: uint32(100 + i)}, verbs.Path{}); err != nil {
			t.Fatal(err)
		}
	}
	write := func(i int) verbs.SendWR {
		return verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(mr, (i%(size/msg))*msg, msg)}, RemoteAddr: 1 << 20, RKey: 1}
	}
	// Fill the link until its queue drains into a socket nobody reads.
	l := n.waitLink(t, peer, qps[0], write)
	if !l.draining {
		t.Fatal("the link's queue never backed up")
	}
	l.wmu.Unlock()
	if _, err := qps[1].PostSend([]verbs.SendWR{write(0)}); err != nil {
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
	got := map[verbs.Status]int{}
	wc := make([]verbs.WC, 64)
	for firsts := 0; firsts < 2; {
		k, err := cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range wc[:k] {
			got[c.Status]++
			if c.Status == verbs.RetryExcErr {
				firsts++
			}
		}
		if k == 0 {
			if err := cq.Wait(ctx); err != nil {
				t.Fatalf("completions so far %v: %v", got, err)
			}
		}
	}
	if got[verbs.Success] != 0 {
		t.Fatalf("completions %v: a request to a peer that reads nothing succeeded", got)
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

// waitLink posts requests made by wr on q until the TCP link to peer is
// up and its queue draining, or 2000 have gone; it returns the link with
// its wmu held.
func (n *Node) waitLink(t *testing.T, peer string, q verbs.QP, wr func(int) verbs.SendWR) *tcpLink {
	t.Helper()
	for i := 0; ; i++ {
		n.linkMu.Lock()
		l := n.tcp[peer]
		n.linkMu.Unlock()
		if l != nil {
			l.wmu.Lock()
			if l.draining || i >= 2000 {
				return l
			}
			l.wmu.Unlock()
		}
		if _, err := q.PostSend([]verbs.SendWR{wr(i)}); err != nil && !errors.Is(err, verbs.ErrQueueFull) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
}
