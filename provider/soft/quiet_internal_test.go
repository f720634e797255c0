package soft

import (
	"testing"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// TestCQQuiet: Quiet says a Poll would find nothing to do exactly when it
// would return nothing: true on an empty CQ of the in-memory wire, false
// while a completion waits and true again once it is polled, false on a
// CQ that failed (closed), whose Poll returns its error.
func TestCQQuiet(t *testing.T) {
	fab := NewFabric()
	var qps [2]verbs.QP
	var cqs [2]*cq
	for i := range qps {
		n, err := fab.NewNode(Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		pd, _ := n.AllocPD()
		c, err := n.CreateCQ(16)
		if err != nil {
			t.Fatal(err)
		}
		cqs[i] = c.(*cq)
		if qps[i], err = pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: c, RecvCQ: c, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range qps {
		if err := verbs.Connect(qps[i], qps[1-i].Endpoint(), verbs.Path{}); err != nil {
			t.Fatal(err)
		}
	}
	blk, err := offheap.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blk.Close() })
	pd, _ := cqs[0].node.AllocPD()
	mr, err := pd.RegMR(blk.Bytes(), verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mr.Close() })
	c := cqs[0]
	if !c.Quiet() {
		t.Fatal("an empty CQ of the in-memory wire is not quiet")
	}
	// The READ completes before PostSend returns, on the in-memory wire.
	wr := verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(mr, 0, 8)}, RemoteAddr: mr.Addr(), RKey: mr.RKey()}
	if _, err := qps[0].PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	if c.Quiet() {
		t.Fatal("a CQ holding a completion is quiet")
	}
	wc := make([]verbs.WC, 2)
	if n, err := c.Poll(wc); n != 1 || err != nil {
		t.Fatalf("poll: %d completions, %v", n, err)
	}
	if !c.Quiet() {
		t.Fatal("a CQ polled empty is not quiet")
	}
	qps[0].Close()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if c.Quiet() {
		t.Fatal("a closed CQ is quiet")
	}
	if _, err := c.Poll(wc); err == nil {
		t.Fatal("a closed CQ's poll returned no error")
	}
}
