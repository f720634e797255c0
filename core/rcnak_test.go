package core_test

import (
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestRCNakKeepsOtherEnd: a READ over a pooled RC QP that the responder
// refuses (REM_ACCESS_ERR: the region was unexported meanwhile) breaks the
// requester's QP, and recovery drops it; the responder's end of the pair
// must not stay in service pointing at a QP that no longer answers. Node 2
// then READs node 1 and must get its answer promptly, not RETRY_EXC_ERR
// after the retry timeout (and node 1 marked dead). This is lite's TestMove
// flake: a Move's revoked grants NAK mappers' requests on RC QPs, and the
// holders' own requests over the other ends stalled for a second.
func TestRCNakKeepsOtherEnd(t *testing.T) {
	c := start(t, 2, core.Config{DCIs: 1, HotOps: 5, HotWindow: 2 * time.Millisecond, ColdWindows: 250})
	a, b := c.Node(1), c.Node(2)
	qa, ra := reader(t, a, b, "gone")
	qb, rb := reader(t, b, a, "back")
	run := func(q *core.Queue, r krcore.Request) verbs.Status {
		t.Helper()
		if _, err := q.Push(ctx(t), true, r); err != nil {
			t.Fatal(err)
		}
		var out [1]krcore.Completion
		if _, err := q.PopWait(ctx(t), out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0].Status
	}
	// Node 1 reads hot until the pair holds an RC QP, both ends pooled.
	for end := time.Now().Add(5 * time.Second); a.Stats().RCs == 0 || b.Stats().RCs == 0; {
		if time.Now().After(end) {
			t.Fatalf("no RC QP built: %+v / %+v", a.Stats(), b.Stats())
		}
		if st := run(qa, ra); st != verbs.Success {
			t.Fatalf("READ before the unexport: %v", st)
		}
	}
	for range 3 { // node 2's queue now takes its end of the pair
		if st := run(qb, rb); st != verbs.Success {
			t.Fatalf("node 2's READ before the NAK: %v", st)
		}
	}
	if err := b.Unexport("gone"); err != nil {
		t.Fatal(err)
	}
	if st := run(qa, ra); st != verbs.RemAccessErr {
		t.Fatalf("READ of an unexported region: %v, want REM_ACCESS_ERR", st)
	}
	for i := range 5 {
		start := time.Now()
		if st := run(qb, rb); st != verbs.Success {
			t.Fatalf("node 2's READ %d after node 1's NAK: %v after %v, want SUCCESS", i, st, time.Since(start).Round(time.Millisecond))
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Errorf("node 2's READ %d after node 1's NAK took %v (a retry timeout is 200 ms)", i, d.Round(time.Millisecond))
		}
	}
	t.Logf("node 1 %+v; node 2 %+v", a.Stats(), b.Stats())
}
