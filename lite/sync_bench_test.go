package lite_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/lite"
)

// BenchmarkLock: a lock mastered by node 2. uncontended: Lock and Unlock
// from node 1 alone. handoff: the two nodes take turns; each turn the
// holder waits until the other has queued, then unlocks, and handoff-µs
// is the time from the start of its Unlock to the return of the other's
// Lock. Node 1 embedded and through krcored.
func BenchmarkLock(b *testing.B) {
	masterAPI, users := apis(b)
	for _, name := range []string{"embedded", "daemon"} {
		ctx := context.Background()
		master, user := open(b, masterAPI), open(b, users[name])
		mine, err := master.NewLock(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		theirs, err := user.OpenLock(ctx, 2, "bench")
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name+"/uncontended", func(b *testing.B) {
			for b.Loop() {
				if err := theirs.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := theirs.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/handoff", func(b *testing.B) {
			handoffs(b, mine, theirs)
		})
		master.Close()
		user.Close()
	}
}

// handoffs hands the lock b.N times between two holders, mine (made by
// NewLock, whose tickets it watches) and theirs, and reports the mean
// time from an Unlock's start to the other's acquisition.
func handoffs(b *testing.B, mine, theirs *lite.Lock) {
	ctx := context.Background()
	if err := mine.Lock(ctx); err != nil {
		b.Fatal(err)
	}
	ls := [2]*lite.Lock{mine, theirs}
	var total time.Duration
	got := make(chan time.Time)
	for i := 0; b.Loop(); i++ {
		holder, next := ls[i%2], ls[(i+1)%2]
		queued := lite.Tickets(mine) + 1
		go func() {
			if err := next.Lock(ctx); err != nil {
				b.Error(err)
			}
			got <- time.Now()
		}()
		for lite.Tickets(mine) != queued {
			runtime.Gosched()
		}
		start := time.Now()
		if err := holder.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		total += (<-got).Sub(start)
		if b.Failed() {
			return
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "handoff-µs")
	ls[b.N%2].Unlock(ctx)
}

// BenchmarkBarrier: 8 participants, 4 goroutines on each node, pass a
// barrier mastered by node 2; one op is one generation. Node 1 embedded
// and through krcored.
func BenchmarkBarrier(b *testing.B) {
	masterAPI, users := apis(b)
	for _, name := range []string{"embedded", "daemon"} {
		ctx := context.Background()
		master, user := open(b, masterAPI), open(b, users[name])
		b.Run(name+"/8", func(b *testing.B) {
			var wg sync.WaitGroup
			for i := range 8 {
				n := []*lite.Node{master, user}[i%2]
				wg.Go(func() {
					for range b.N {
						if err := n.Barrier(ctx, 2, "bench", 8); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
		master.Close()
		user.Close()
	}
}
