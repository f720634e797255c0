package lite_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/lite"
)

// waitWaiting waits until k participants wait at the barrier name of
// master.
func waitWaiting(t *testing.T, master *lite.Node, name string, k int) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); lite.BarrierWaiting(master, name) != k; runtime.Gosched() {
		if time.Now().After(end) {
			t.Fatalf("%d wait at barrier %q after 5 s, want %d", lite.BarrierWaiting(master, name), name, k)
		}
	}
}

// barrierAsync runs Barrier in a goroutine; its error arrives on the
// channel.
func barrierAsync(ctx context.Context, n *lite.Node, name string, count int) chan error {
	errc := make(chan error, 1)
	go func() { errc <- n.Barrier(ctx, 2, name, count) }()
	return errc
}

// TestBarrier: 8 participants, 4 goroutines on each node, pass a barrier
// mastered by node 2 five times; none leaves a generation before all 8
// arrived at it.
func TestBarrier(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)
			const parties, rounds = 8, 5
			var arrived [rounds]atomic.Int32
			var wg sync.WaitGroup
			for i := range parties {
				n := []*lite.Node{master, mapper}[i%2]
				wg.Go(func() {
					for r := range rounds {
						arrived[r].Add(1)
						if err := n.Barrier(ctx, 2, "step", parties); err != nil {
							t.Error(err)
							return
						}
						if k := arrived[r].Load(); k != parties {
							t.Errorf("left generation %d when %d of %d had arrived", r, k, parties)
						}
					}
				})
			}
			wg.Wait()
			if k := lite.BarrierWaiting(master, "step"); k != 0 {
				t.Fatalf("%d left waiting", k)
			}
		})
	}
}

// TestBarrierCancel: a participant that gives up is withdrawn and does not
// count; a count that differs is refused; a participant that never comes
// holds the others only until their contexts end.
func TestBarrierCancel(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)

			cctx, cancel := context.WithCancel(ctx)
			gaveUp := barrierAsync(cctx, mapper, "c", 2)
			waitWaiting(t, master, "c", 1)
			cancel()
			if err := <-gaveUp; !errors.Is(err, context.Canceled) {
				t.Fatalf("Barrier cancelled while waiting: %v", err)
			}
			if k := lite.BarrierWaiting(master, "c"); k != 0 {
				t.Fatalf("%d wait after the cancelled participant returned, want 0", k)
			}
			first := barrierAsync(ctx, master, "c", 2)
			waitWaiting(t, master, "c", 1) // not released by the withdrawn one
			if err := mapper.Barrier(ctx, 2, "c", 2); err != nil {
				t.Fatal(err)
			}
			if err := <-first; err != nil {
				t.Fatal(err)
			}

			first = barrierAsync(ctx, master, "m", 2)
			waitWaiting(t, master, "m", 1)
			if err := mapper.Barrier(ctx, 2, "m", 3); !errors.Is(err, krcore.ErrInvalid) {
				t.Fatalf("Barrier with another count: %v, want ErrInvalid", err)
			}
			if err := mapper.Barrier(ctx, 2, "m", 2); err != nil {
				t.Fatal(err)
			}
			if err := <-first; err != nil {
				t.Fatal(err)
			}

			dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			if err := master.Barrier(dctx, 2, "absent", 2); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Barrier whose other participant never comes: %v", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("Barrier returned %v after its deadline", d)
			}
		})
	}
}

// TestBarrierClose: a participant whose Node closes after arriving stays
// counted, so the others pass; participants waiting on a master that
// closes fail with ErrClosed.
func TestBarrierClose(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api) // the test closes both

			closed := barrierAsync(ctx, mapper, "x", 3)
			waitWaiting(t, master, "x", 1)
			if err := mapper.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-closed; !errors.Is(err, krcore.ErrClosed) {
				t.Fatalf("Barrier at Close: %v, want ErrClosed", err)
			}
			other := barrierAsync(ctx, master, "x", 3)
			if err := master.Barrier(ctx, 2, "x", 3); err != nil {
				t.Fatal(err)
			}
			if err := <-other; err != nil {
				t.Fatal(err)
			}

			mapper = open(t, api)
			waiting := barrierAsync(ctx, mapper, "y", 2)
			waitWaiting(t, master, "y", 1)
			start := time.Now()
			if err := master.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-waiting; !errors.Is(err, krcore.ErrClosed) {
				t.Fatalf("Barrier whose master closed: %v, want ErrClosed", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("told %v after the master closed", d)
			}
		})
	}
}
