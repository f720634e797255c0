package core

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestWaiterBlocksOnBusyPoller: a waiter woken by a completion while
// another goroutine holds the receive poller's lock (a poller preempted
// mid-poll) waits for the lock instead of sleeping on the completion queue
// again and again, whose Wait returns at once while the completion is
// still queued; once the lock is free it gets its message.
func TestWaiterBlocksOnBusyPoller(t *testing.T) {
	fab := soft.NewFabric()
	d1, _ := fab.NewNode(soft.Config{})
	d2, _ := fab.NewNode(soft.Config{})
	defer d1.Close()
	defer d2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path := verbs.Path{Timeout: 50 * time.Millisecond, RetryCount: 3}
	a, err := New(ctx, Config{Device: d1, Node: 1, Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := New(ctx, Config{Device: d2, Node: 2, Path: path, Meta: []meta.Info{a.MetaInfo()}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	recv, send := boundPair(ctx, t, b, a)
	out, err := a.RegMR(8, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]krcore.Message, 1)
	exchange := func() {
		if err := send.PushOne(ctx, true, krcore.Request{Op: verbs.OpSend, Local: out.Range(0, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	exchange() // connects
	if _, err := recv.PopMsgsWait(ctx, msgs); err != nil {
		t.Fatal(err)
	}

	pl := b.recvs
	pl.mu.Lock() // a poller that holds the lock and does not run
	got := make(chan error, 1)
	go func() {
		_, err := recv.PopMsgsWait(ctx, msgs)
		got <- err
	}()
	exchange()
	time.Sleep(10 * time.Millisecond) // the message is on b's receive queue
	before := pl.sleeps.Load()
	time.Sleep(100 * time.Millisecond)
	slept := pl.sleeps.Load() - before
	pl.mu.Unlock()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if msgs[0].Len != 8 {
		t.Fatalf("message of %d B, want 8", msgs[0].Len)
	}
	// Two waiters (the runtime's own and the test's) may each wake once
	// and a few times more for a displacement; a busy loop sleeps
	// thousands of times in 100 ms.
	if slept > 10 {
		t.Fatalf("waiters slept %d times on a completion queue holding a completion while the poller's lock was held, want a few", slept)
	}
}

// boundPair is a queue of rx bound to a port with receive buffers posted,
// and a queue of tx connected to it.
func boundPair(ctx context.Context, t *testing.T, rx, tx *Runtime) (recv, send *Queue) {
	t.Helper()
	return boundPortPair(ctx, t, rx, tx, 7)
}

// boundPortPair is boundPair with the queue at rx bound to port.
func boundPortPair(ctx context.Context, t *testing.T, rx, tx *Runtime, port uint32) (recv, send *Queue) {
	t.Helper()
	recv, err := rx.Queue()
	if err != nil {
		t.Fatal(err)
	}
	if err := recv.Bind(port); err != nil {
		t.Fatal(err)
	}
	in, err := rx.RegMR(4*64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if err := recv.PushRecv(in.Range(i*64, 64)); err != nil {
			t.Fatal(err)
		}
	}
	if send, err = tx.Queue(); err != nil {
		t.Fatal(err)
	}
	if err := send.Connect(ctx, rx.cfg.Node, &krcore.ConnectOptions{Port: port}); err != nil {
		t.Fatal(err)
	}
	return recv, send
}
