package core_test

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bounded"
)

// TestPushWakesOnPop: a Push that waits because its queue holds all the
// finished completions it can (none in flight: only a pop makes room)
// returns once another goroutine pops one.
func TestPushWakesOnPop(t *testing.T) {
	onDCPairs(t, func(t *testing.T, a, b *core.Runtime) {
		q, req := reader(t, a, b, "r")
		long := ctx(t)
		for { // fill the queue with finished completions nobody pops
			_, err := q.Push(long, false, req)
			if err == nil {
				continue
			}
			if !errors.Is(err, krcore.ErrNoCredit) {
				t.Fatal(err)
			}
			if core.DebugDone(q) == q.Outstanding() {
				break // refused for want of room, not of credit
			}
			q.Pop(nil) // dispatch without popping
			runtime.Gosched()
		}
		res := make(chan error, 1)
		go func() {
			_, err := q.Push(long, true, req)
			res <- err
		}()
		settle() // the Push sleeps (if not yet, the test is merely weaker)
		var out [1]krcore.Completion
		if k := q.Pop(out[:]); k != 1 {
			t.Fatalf("popped %d of the finished completions, want 1", k)
		}
		err := bounded.Within(t, 10*time.Second, "a Push waiting for room a pop made", func() error { return <-res })
		if err != nil {
			t.Fatal(err)
		}
	})
}
