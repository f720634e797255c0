package client

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// TestPopAnyWaitFirstProtocol: against a daemon that does not ring the
// message bell for completions (no wire.FeatureClientAny in its hello),
// PopAnyWait still returns a completion, at the end of a sleep's slice.
func TestPopAnyWaitFirstProtocol(t *testing.T) {
	v := ringVQ(t)
	ctx := pump(t, v) // rings only the completion bell
	out := make([]krcore.Completion, 1)
	for i := range 20 {
		if err := v.PushOne(ctx, false, krcore.Request{ID: uint64(i), Op: verbs.OpRead}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		nc, _, err := v.PopAnyWait(ctx, out, make([]krcore.Message, 1))
		if err != nil || nc != 1 || out[0].ID != uint64(i) {
			t.Fatalf("#%d: PopAnyWait: %d completions, %v, %+v", i, nc, err, out[0])
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("#%d: PopAnyWait took %v", i, took)
		}
	}
}

// ringVQ is a VQ on rings of its own with no daemon behind them: the test
// plays the daemon's side (pump, or the rings' counters directly). The
// rings are released when the test ends.
func ringVQ(t *testing.T) *VQ {
	t.Helper()
	v := &VQ{c: &Client{credits: 16, maxMsg: 64}, cqWait: make(chan struct{}, 1), msgWait: make(chan struct{}, 1),
		ctlWait: make(chan struct{}, 1), done: make(chan struct{}), node: 2}
	if err := v.alloc(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.release)
	return v
}

// pump runs completeAll on v's rings until the test ends (it is stopped
// before v's rings are released), and returns the context, 20 s long, the
// test's calls take.
func pump(t *testing.T, v *VQ) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		completeAll(ctx, v.ring, v.door, v.cq)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return ctx
}

// completeAll plays the daemon's pump on ring until ctx ends: it sleeps on
// door (its sleep flag always raised, so every push rings it) and
// completes every SQE it finds, ringing cq for a sleeping client.
func completeAll(ctx context.Context, ring *wire.Ring, door, cq *wire.Bell) {
	wire.Publish(ring.Ctr(wire.DaemonSleeps), 1)
	var seq uint64
	for {
		// The look after raising the flag: a push before it did not ring.
		if tail := ring.Ctr(wire.SQTail).Load(); seq != tail {
			for ; seq < tail; seq++ {
				ring.PutCQE(seq, wire.CQE{Seq: seq, Status: verbs.Success})
			}
			wire.Publish(ring.Ctr(wire.SQHead), seq)
			wire.Publish(ring.Ctr(wire.CQTail), seq)
			wire.Publish(ring.Ctr(wire.Retired), seq)
			wire.Notify(ring.Ctr(wire.ClientCQ), cq)
		}
		if door.Sleep(ctx) != nil {
			return
		}
	}
}

// TestSpinOnlyWhilePumpPolls: a waiter for a message spins after a push
// that found the daemon's pump polling the ring, and sleeps at once after
// one that had to ring its doorbell; a waiter for a completion spins after
// either.
func TestSpinOnlyWhilePumpPolls(t *testing.T) {
	v := ringVQ(t)
	ctx := context.Background()
	for i, asleep := range []bool{false, true, false, true, true} {
		var flag uint64
		if asleep {
			flag = 1
		}
		v.ring.Ctr(wire.DaemonSleeps).Store(flag)
		if err := v.PushOne(ctx, false, krcore.Request{ID: uint64(i), Op: verbs.OpSend}); err != nil {
			t.Fatal(err)
		}
		want := wire.SpinFor
		if asleep {
			want = 0
		}
		if got := v.spin(wire.ClientMsg); got != want {
			t.Errorf("push #%d, pump asleep %v: message wait spins %v, want %v", i, asleep, got, want)
		}
		if got := v.spin(wire.ClientCQ); got != wire.SpinFor {
			t.Errorf("push #%d, pump asleep %v: completion wait spins %v, want %v", i, asleep, got, wire.SpinFor)
		}
	}
}
