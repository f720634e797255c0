package core_test

import (
	"runtime"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestPushOneAllocs: one request pushed through the krcore.VQ interface
// with PushOne and popped (PopWait, or Pop in a loop) allocates nothing; Push of the same request
// builds its variadic slice on the heap (logged: the compiler's doing).
func TestPushOneAllocs(t *testing.T) {
	ctx, c := ctx(t), benchCluster(t)
	_, req := vqReader(t, c.Node(1), c.Node(2))
	q, err := opaqueQueue(core.Embed(c.Node(1)))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Connect(ctx, 2, nil); err != nil {
		t.Fatal(err)
	}
	out := make([]krcore.Completion, 1)
	read := func(push func() error) {
		if err := push(); err != nil {
			t.Fatal(err)
		}
		if _, err := q.PopWait(ctx, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Status != verbs.Success {
			t.Fatal(out[0].Status)
		}
	}
	one := func() error { return q.PushOne(ctx, false, req) }
	variadic := func() error { _, err := q.Push(ctx, false, req); return err }
	for range 100 {
		read(one)
	}
	if n := testing.AllocsPerRun(1000, func() { read(one) }); n != 0 {
		t.Errorf("PushOne and PopWait of an 8 B READ allocate %.0f times a request", n)
	}
	spin := func() {
		if err := q.PushOne(ctx, false, req); err != nil {
			t.Fatal(err)
		}
		for q.Pop(out) == 0 {
		}
		if out[0].Status != verbs.Success {
			t.Fatal(out[0].Status)
		}
	}
	if n := testing.AllocsPerRun(1000, spin); n != 0 {
		t.Errorf("PushOne and a Pop loop of an 8 B READ allocate %.0f times a request", n)
	}
	t.Logf("Push(ctx, false, req) and PopWait allocate %.0f times a request", testing.AllocsPerRun(1000, func() { read(variadic) }))
}

// opaqueQueue makes a queue the compiler cannot see the type of, as an
// application's handed from elsewhere: its calls go through the interface
// (a *core.Queue the compiler sees has them devirtualized).
//
//go:noinline
func opaqueQueue(api krcore.API) (krcore.VQ, error) { return api.Queue() }

// TestQueueRingOnFirstRequest: a VQ that is made, connected and closed
// without a request costs no completion ring (16 KiB at the default
// credits, which made every fresh VQ's cold connect pay the collector's
// work), and its first request makes one and completes.
func TestQueueRingOnFirstRequest(t *testing.T) {
	ctx, c := ctx(t), benchCluster(t)
	rt := c.Node(1)
	const n = 200
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		q, err := rt.Queue()
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Connect(ctx, 2, nil); err != nil {
			t.Fatal(err)
		}
		q.Close()
	}
	runtime.ReadMemStats(&after)
	// A ring is 16 KiB; the queue itself (~400 B) and what the runtime's
	// own goroutines allocate meanwhile stay well below 6 KiB a queue.
	per := (after.TotalAlloc - before.TotalAlloc) / n
	t.Logf("a VQ made, connected and closed: %d B", per)
	if per > 6<<10 {
		t.Errorf("a VQ made, connected and closed allocated %d B, want no 16 KiB completion ring", per)
	}
	q, req := vqReader(t, rt, c.Node(2)) // connected, no request yet
	out := make([]krcore.Completion, 1)
	for i := range 600 { // past the ring's 512 entries: it wraps
		if err := q.PushOne(ctx, false, req); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if _, err := q.PopWait(ctx, out); err != nil || out[0].Status != verbs.Success {
			t.Fatalf("request %d: %v %v", i, err, out[0].Status)
		}
	}
}
