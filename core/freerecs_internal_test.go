package core

import (
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// TestFreeRecsZero: a physical QP's free records (the ring's slots outside
// those in flight) are zero, whatever the requests that left them held:
// accept writes only the fields a request sets, so a field a retired
// request left behind (a message's source MR, a notifying WRITE's flag,
// an atomic's operands) would reach the next one's work request. Batches
// and single pushes of every kind the runtime posts, refused ones among
// them, on a DCI and after the route moves to an RC QP.
func TestFreeRecsZero(t *testing.T) {
	ctx, a, b := rcPair(t, 20*time.Second)
	data, err := a.RegMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Export("data", data, 0, 4096, verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	srv, err := a.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.Bind(9); err != nil {
		t.Fatal(err)
	}
	q, err := b.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Connect(ctx, 1, &krcore.ConnectOptions{Port: 9}); err != nil {
		t.Fatal(err)
	}
	g, err := q.Region(ctx, "data")
	if err != nil {
		t.Fatal(err)
	}
	local, err := b.RegMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []krcore.Request{
		{Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(0), Unsignaled: true},
		{Op: verbs.OpSend, Local: local.Range(64, 16)},
		{Op: verbs.OpWriteImm, Imm: 5, Local: local.Range(128, 8), Remote: g.At(128)},
		{Op: verbs.OpFetchAdd, Local: local.Range(256, 8), Remote: g.At(256), Compare: 1},
		{Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(4095)}, // refused
		{Op: verbs.OpCompareSwap, Local: local.Range(264, 8), Remote: g.At(264), Compare: 3, Swap: 4},
		{Op: verbs.OpSendImm, Imm: 7, Local: local.Range(512, 1024)},
		{Op: verbs.OpWrite, Local: local.Range(1024, 8), Remote: g.At(1024), Unsignaled: true},
		{Op: verbs.OpRead, Local: local.Range(8, 8), Remote: g.At(8)},
	}
	out := make([]krcore.Completion, len(reqs))
	var msgs [16]krcore.Message
	for round := range 80 {
		if round%2 == 0 {
			if _, err := q.Push(ctx, true, reqs...); err != nil {
				t.Fatal(err)
			}
		} else {
			for _, r := range reqs {
				if err := q.PushOne(ctx, true, r); err != nil {
					t.Fatal(err)
				}
			}
		}
		checkFreeRecs(t, q, round)
		for q.Outstanding() > 0 {
			if round%4 < 2 {
				q.Pop(out) // its poll retires its own completions (completeOwn, completeRun)
			} else if _, err := q.PopWait(ctx, out); err != nil {
				t.Fatal(err)
			}
			if err := ctx.Err(); err != nil {
				t.Fatal(err)
			}
		}
		checkFreeRecs(t, q, round)
		srv.PopMsgs(msgs[:])
		if round == 39 {
			// The rest on an RC QP to the peer, the route it moves to.
			p, err := b.peerFor(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.buildRC(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkFreeRecs fails t if the ring of q's route has a non-zero record
// outside those in flight.
func checkFreeRecs(t *testing.T, q *Queue, round int) {
	t.Helper()
	q.mu.Lock()
	p := q.route
	q.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := p.base + uint64(p.n); s < p.base+uint64(len(p.recs)); s++ {
		if r := p.recs[p.slot(s)]; r != (rec{}) {
			t.Fatalf("round %d: free record %d of %d in flight from %d holds %+v", round, s, p.n, p.base, r)
		}
	}
}
