package soft

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

// TestRNRRestartsRetryTimer: a request retransmitted after an RNR back-off
// is timed from its retransmission, as on hardware. Timed from its first
// transmission, its deadline had passed by the time it went out again, and
// the retry sweep failed it with RETRY_EXC_ERR whenever it ran while the
// retransmission was on the wire: a live peer whose receive queue was
// merely empty for a while looked dead. The test holds the responder while
// the retransmission is on its way to it and runs the sweep's check with a
// clock just short of where the retry timeout ends counted from the RNR NAK.
func TestRNRRestartsRetryTimer(t *testing.T) {
	const timeout, rnr = 200 * time.Millisecond, 500 * time.Millisecond
	fab := NewFabric()
	var qps [2]*qp
	var cqs [2]verbs.CQ
	for i := range qps {
		n, err := fab.NewNode(Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		pd, _ := n.AllocPD()
		cqs[i], _ = n.CreateCQ(16)
		q, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cqs[i], RecvCQ: cqs[i], Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
		if err != nil {
			t.Fatal(err)
		}
		qps[i] = q.(*qp)
	}
	a, b := qps[0], qps[1]
	if err := verbs.Connect(a, b.Endpoint(), verbs.Path{Timeout: timeout, RetryCount: -1}); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(b, a.Endpoint(), verbs.Path{MinRNRTimer: rnr}); err != nil {
		t.Fatal(err)
	}
	// No receive is posted: on the in-memory wire the RNR NAK is back
	// before PostSend returns.
	if _, err := a.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled}}); err != nil {
		t.Fatal(err)
	}
	naked := a.node.now()
	a.mu.Lock()
	waiting := a.rnrWait
	a.mu.Unlock()
	if !waiting {
		t.Fatal("the SEND to an empty receive queue was not NAKed RNR")
	}
	// Hold the responder: the retransmission, due rnr after the NAK, arms
	// the requester's deadline and then waits for b.
	b.mu.Lock()
	for end := time.Now().Add(10 * rnr); a.deadline.Load() == 0; {
		if time.Now().After(end) {
			b.mu.Unlock()
			t.Fatal("no retransmission after the RNR back-off")
		}
		time.Sleep(time.Millisecond)
	}
	a.expire(naked + int64(timeout) - 1)
	b.mu.Unlock()
	if _, err := b.PostRecv([]verbs.RecvWR{{ID: 2}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*rnr)
	defer cancel()
	wc := make([]verbs.WC, 1)
	for {
		if n, err := cqs[0].Poll(wc); err != nil {
			t.Fatal(err)
		} else if n == 1 {
			break
		}
		if err := cqs[0].Wait(ctx); err != nil {
			t.Fatalf("no completion for the SEND: %v", err)
		}
	}
	if wc[0].ID != 1 || wc[0].Status != verbs.Success {
		t.Fatalf("SEND completed %+v, want success once a receive was posted", wc[0])
	}
}
