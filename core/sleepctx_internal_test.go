package core

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/provider/soft"
)

// loneRuntime starts a runtime, node 1, alone on a soft RNIC of its own
// fabric; the runtime, then the device, close when the test ends; ctx ends after
// timeout.
func loneRuntime(t *testing.T, timeout time.Duration) (context.Context, *Runtime) {
	t.Helper()
	dev, err := soft.NewFabric().NewNode(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	rt, err := New(ctx, Config{Device: dev, Node: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return ctx, rt
}

// TestSleepEndsWithContext: a PopWait whose sleeps on the completion
// queue are cut short again and again by wake-ups (each cancels the sleep
// context, and the next sleep makes a new one under the same watch of the
// caller's context) still ends when its context does.
func TestSleepEndsWithContext(t *testing.T) {
	ctx, rt := loneRuntime(t, 20*time.Second)
	q, err := rt.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // wakes q's waiters for nothing, as a dispatcher would
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				rt.kick(q)
				time.Sleep(20 * time.Microsecond)
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	var out [1]krcore.Completion
	for i := range 50 {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Millisecond)
		start := time.Now()
		_, err := q.PopWait(wctx, out[:])
		took := time.Since(start)
		wcancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait %d: %v, want the context's deadline", i, err)
		}
		if took > 2*time.Second {
			t.Fatalf("wait %d ended %v after its 2 ms deadline", i, took)
		}
	}
	if rt.sends.sleeps.Load() == 0 {
		t.Fatal("no wait slept on the completion queue")
	}
}
