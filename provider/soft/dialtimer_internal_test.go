package soft

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// TestTimerStartsOnTheWire: a request posted while its link is still being
// set up (a peer slow to answer the hello) is not timed out before it has
// gone out: its transport timer starts on the wire, as on an RNIC, and the
// set-up is bounded by DialTimeout. A retry timeout shorter than a slow
// hello failed first requests with RETRY_EXC_ERR on a loaded machine. The
// peer never answers the READ, so it still fails, after the hello.
func TestTimerStartsOnTheWire(t *testing.T) {
	const timeout, helloAfter = 200 * time.Millisecond, 800 * time.Millisecond
	peer := stalledPeer(t, helloAfter)
	n, err := NewNode(Config{Listen: "127.0.0.1:0", RetryTimeout: timeout, DialTimeout: 10 * time.Second, TCPOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	pd, _ := n.AllocPD()
	cq, _ := n.CreateCQ(16)
	blk, err := offheap.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer blk.Close()
	mr, err := pd.RegMR(blk.Bytes(), verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(q, verbs.Endpoint{Addr: peer, QPN: 100}, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	read := verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(mr, 0, 8)}, RemoteAddr: 1 << 20, RKey: 1}
	if _, err := q.PostSend([]verbs.SendWR{read}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wc [1]verbs.WC
	for {
		k, err := cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		if k == 1 {
			break
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("no completion: %v", err)
		}
	}
	took := time.Since(start)
	if wc[0].Status != verbs.RetryExcErr {
		t.Fatalf("completion %v, want RETRY_EXC_ERR (the peer never answers)", wc[0].Status)
	}
	if took < helloAfter {
		t.Fatalf("the READ timed out %v after its post, before its link was up (%v): its timer ran while it waited for the link", took, helloAfter)
	}
	t.Logf("RETRY_EXC_ERR %v after the post, the hello took %v", took, helloAfter)
}
