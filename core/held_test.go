package core_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestHeldRequestRunsUnpolled: a request pushed while the queue's route
// changes waits for the queue's earlier requests to complete, and then
// runs even if no one ever polls the queue, as a request posted on an RC
// QP runs whether or not its CQ is polled. Here the earlier WRITE's
// completion is never popped: the runtime must reap it itself.
func TestHeldRequestRunsUnpolled(t *testing.T) {
	c := start(t, 2, core.Config{DCIs: 1, HotOps: 5, HotWindow: 2 * time.Millisecond, ColdWindows: 1000})
	a, b := c.Node(1), c.Node(2)
	target := serve(t, b, "w", 64)
	g, err := a.Region(ctx(t), b.Node(), "w")
	if err != nil {
		t.Fatal(err)
	}
	local, err := a.RegMR(64, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	q := mustQueue(t, a, b.Node())
	write := func(v uint64) {
		t.Helper()
		binary.NativeEndian.PutUint64(local.Bytes()[8*(v%2):], v)
		req := krcore.Request{ID: v, Op: verbs.OpWrite, Local: local.Range(int(8*(v%2)), 8), Remote: g.At(0)}
		if _, err := q.Push(ctx(t), true, req); err != nil {
			t.Fatal(err)
		}
	}
	// Hot (HotOps requests in a window) with every WRITE in flight on the
	// DCI, never popped, until the manager builds an RC QP. On a loaded
	// machine 8 WRITEs may straddle windows, none of them hot: it writes
	// on (up to 200, well within the queue's room for unpopped ones).
	for v, wait := uint64(1), time.Now().Add(5*time.Second); a.Stats().RCs == 0; v++ {
		if time.Now().After(wait) {
			t.Fatalf("no RC QP built for a hot peer: %+v", a.Stats())
		}
		if v <= 200 {
			write(v)
		} else {
			time.Sleep(time.Millisecond)
		}
	}
	// The next WRITE finds a new route with those in flight: the queue
	// holds it for the RC QP until they complete.
	write(1001)
	deadline := time.Now().Add(5 * time.Second)
	for binary.NativeEndian.Uint64(target.Bytes()) != 1001 {
		if time.Now().After(deadline) {
			t.Fatalf("the held WRITE never ran: target %d, stats %+v", binary.NativeEndian.Uint64(target.Bytes()), a.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}
