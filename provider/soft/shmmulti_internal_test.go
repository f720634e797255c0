//go:build linux

package soft

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

// TestShmMultiLinkWaiterReads: a CQ whose QPs talk to two peers over
// shared-memory links (a runtime serving two other processes) is still
// waited on by reading the link its QPs used last, so a completion
// reaches the waiting goroutine without a hand-off from a background
// reader; and a completion on the other link still ends the wait.
func TestShmMultiLinkWaiterReads(t *testing.T) {
	var nodes [3]*Node
	for i := range nodes {
		n, err := NewNode(Config{Listen: "127.0.0.1:0", RetryTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nodes[i] = n
	}
	a := nodes[0]
	pd, err := a.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	local, err := pd.RegMR(roleBlock(t), verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	var qps [2]verbs.QP
	for i, peer := range nodes[1:] {
		qps[i] = multiPeer(t, pd, c, peer)
	}
	// SENDs, which complete when the peer's ACK comes back over the link
	// (a READ of shared memory may complete in place, in the poster).
	send := func(i int, id uint64) (waited bool) {
		t.Helper()
		wr := verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(local, 0, 8)}}
		if _, err := qps[i].PostSend([]verbs.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var wc [1]verbs.WC
		for {
			if k, err := c.Poll(wc[:]); err != nil || k == 1 {
				if err != nil || wc[0].Status != verbs.Success || wc[0].ID != id {
					t.Fatalf("SEND %d over link %d: %v, %+v", id, i, err, wc[0])
				}
				return waited
			}
			waited = true
			if err := c.Wait(ctx); err != nil {
				t.Fatalf("wait for SEND %d over link %d: %v", id, i, err)
			}
		}
	}
	send(0, 1)
	send(1, 2) // c's QPs now use two links
	// The pump that sent a SEND notes its link after sending it, and the
	// first SEND over a link is sent by the link's dialer, which pumps
	// the QPs that waited for it: that note may come after the
	// completion (failed 1 of 6 package runs under -race at load ~10).
	cq := c.(*cq)
	for deadline := time.Now().Add(5 * time.Second); !cq.multi.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the CQ does not know it has two links")
		}
	}
	waits, readByWaiter := 0, 0
	for i := range multiRounds {
		if !send(1, uint64(10+i)) {
			continue
		}
		waits++
		if l := cq.shm.Load(); l.role.Load() == shmRoleLent {
			readByWaiter++ // a waiter read it and left the role lent (keep)
		}
	}
	t.Logf("%d of %d waits read their link", readByWaiter, waits)
	if waits == 0 || readByWaiter < waits/2 {
		t.Fatalf("%d of %d waits read their link, want most: completions came by hand-off", readByWaiter, waits)
	}
	send(0, 100) // the link read before is given back, or read: either way it completes
}

// multiRounds is how many SENDs TestShmMultiLinkWaiterReads waits for.
const multiRounds = 40

// multiPeer makes an RC QP on pd (completions on c) connected to one on
// peer, with receives posted at the peer for every SEND of the test.
func multiPeer(t *testing.T, pd verbs.PD, c verbs.CQ, peer *Node) verbs.QP {
	t.Helper()
	init := func(pd verbs.PD, c verbs.CQ) verbs.QP {
		q, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: c, RecvCQ: c, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 2 * multiRounds, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Close() })
		return q
	}
	ppd, err := peer.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	pc, err := peer.CreateCQ(4 * multiRounds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	mr, err := ppd.RegMR(roleBlock(t), verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	x, y := init(pd, c), init(ppd, pc)
	p := verbs.Path{Timeout: 2 * time.Second, RetryCount: 3}
	if err := verbs.Connect(x, y.Endpoint(), p); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(y, x.Endpoint(), p); err != nil {
		t.Fatal(err)
	}
	for i := range 2 * multiRounds {
		if _, err := y.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{verbs.SGEOf(mr, 0, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	return x
}
