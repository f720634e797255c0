package core_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// hammer keeps READs going from q to g until stop closes, as an
// application that does not know its peer died would; it returns how
// many completed with an error.
func hammer(q *core.Queue, req core.Request, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	var out [16]core.Completion
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-stop; cancel() }()
	for {
		if _, err := q.Push(ctx, true, req); err != nil && ctx.Err() != nil {
			return
		}
		if _, err := q.PopWait(ctx, out[:]); err != nil && ctx.Err() != nil {
			return
		}
	}
}

// TestDeadPeerSparesControlPath: node 1 holds an RC QP to a hot node 3,
// which dies while node 1 keeps sending to it; control calls from node 1
// to the live node 2 (region lookups) and from node 2 to node 1 keep
// answering within a control round trip's retries, not after the dead
// peer's timeouts.
func TestDeadPeerSparesControlPath(t *testing.T) {
	c := start(t, 3, core.Config{DCIs: 2, HotOps: 2, HotWindow: 2 * time.Millisecond})
	a, b := c.Node(1), c.Node(2)
	serve(t, b, "live", 64)
	q3, req3 := reader(t, a, c.Node(3), "dead")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go hammer(q3, req3, stop, &wg)
	}
	defer func() { close(stop); wg.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for a.Stats().RCs == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no RC QP to the hot peer: %+v", a.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.Remove(3, true); err != nil {
		t.Fatal(err)
	}
	var worst time.Duration
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		for _, call := range []struct {
			from *core.Runtime
			to   core.NodeID
			name string
		}{{a, 2, "live"}, {b, 1, "none"}} {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			t0 := time.Now()
			_, err := call.from.Region(cctx, call.to, call.name)
			d := time.Since(t0)
			cancel()
			if err != nil && !errors.Is(err, core.ErrNoRegion) {
				t.Fatalf("region %q of live node %d from node %d after %v: %v", call.name, call.to, call.from.Node(), d, err)
			}
			worst = max(worst, d)
		}
	}
	t.Logf("slowest control call to a live node while node 3 lay dead: %v; stats %+v", worst, a.Stats())
	if worst > 250*time.Millisecond {
		t.Errorf("a control call to a live node took %v while a dead peer was being retried", worst)
	}
}

var _ = verbs.OpRead

