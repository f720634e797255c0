package core

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore"
)

// TestKickCountsWokenSleepers: a kick counts in Runtime.readied, which
// makes the next sleep on a completion queue yield first (sleepOnCQ), only
// when it woke a goroutine asleep on the queue: a kick of a queue nobody
// waits on readies nobody and costs the next sleeper no yield.
func TestKickCountsWokenSleepers(t *testing.T) {
	ctx, rt := loneRuntime(t, 10*time.Second)
	q, err := rt.Queue()
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Bind(7); err != nil {
		t.Fatal(err)
	}

	before := rt.readied.Load()
	rt.kick(q)
	if n := rt.readied.Load() - before; n != 0 {
		t.Fatalf("a kick of a queue nobody waits on counted %d wake-ups, want 0", n)
	}

	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := q.PopMsgsWait(wctx, make([]krcore.Message, 1))
		done <- err
	}()
	asleep := func() bool {
		if r := rt.recvs.role.Load(); r != nil && r.q == q {
			return true // sleeping on the completion queue
		}
		return q.waker.armed.Load() // sleeping aside, on its waker
	}
	for !asleep() {
		if ctx.Err() != nil {
			t.Fatal("the waiter never went to sleep")
		}
		time.Sleep(time.Millisecond)
	}
	before = rt.readied.Load()
	rt.kick(q)
	if n := rt.readied.Load() - before; n < 1 {
		t.Fatalf("a kick of a queue whose waiter sleeps counted %d wake-ups, want 1 or more", n)
	}
	stop()
	if err := <-done; err == nil {
		t.Fatal("PopMsgsWait with no message returned no error")
	}
}
