package core

import (
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bounded"
	"github.com/krcore/krcore/verbs"
)

// TestCloseFailsHeld: a request its queue holds for a new route when the
// runtime or the queue closes (postLocked's stepHold or stepReconnect:
// the goroutine that would post it, reapHeld or reconnect, does not start
// once the runtime's Close began, or leaves on the queue's Close)
// completes with WR_FLUSH_ERR, so a caller spinning on Pop for it ends.
func TestCloseFailsHeld(t *testing.T) {
	for _, what := range []string{"runtime", "queue"} {
		t.Run(what, func(t *testing.T) { closeHeld(t, what == "runtime") })
	}
}

// closeHeld is TestCloseFailsHeld closing the runtime, or else the queue.
func closeHeld(t *testing.T, runtime bool) {
	ctx, a, b := rcPair(t, 20*time.Second)
	remote, err := b.RegMR(64, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Export("held", remote, 0, 64, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	g, err := a.Region(ctx, b.Node(), "held")
	if err != nil {
		t.Fatal(err)
	}
	local, err := a.RegMR(64, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	q, err := a.Queue()
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Connect(ctx, b.Node(), nil); err != nil {
		t.Fatal(err)
	}
	req := krcore.Request{ID: 7, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(0)}
	q.mu.Lock()
	var x rec
	if !q.accept(&req, &x) {
		q.mu.Unlock()
		t.Fatal("the READ was refused")
	}
	q.held = append(q.held, x) // as postLocked holds it
	q.mu.Unlock()
	closer := q.Close
	if runtime {
		closer = a.Close
	}
	if err := closer(); err != nil {
		t.Fatal(err)
	}
	var out [1]krcore.Completion
	err = bounded.Within(t, 5*time.Second, "Pop of the held request after Close", func() error {
		for q.Pop(out[:]) == 0 {
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].ID != 7 || out[0].Status != verbs.WRFlushErr {
		t.Errorf("held request after Close: %+v, want ID 7 WR_FLUSH_ERR", out[0])
	}
	if k := q.Outstanding(); k != 0 {
		t.Errorf("%d outstanding after Close, want 0", k)
	}
}
