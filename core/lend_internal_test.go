package core

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// lendPair is two runtimes on one in-memory fabric with two ports bound at
// b (7 and 9) and a queue of a connected to each; serveRecvs's rests and
// lazy waits aside last an hour, so that it brings no message to a waiter
// in these tests.
func lendPair(t *testing.T) (ctx context.Context, b *Runtime, recvs, sends [2]*Queue) {
	t.Helper()
	old := SetRestRound(time.Hour)
	t.Cleanup(func() { SetRestRound(old) })
	fab := soft.NewFabric()
	d1, _ := fab.NewNode(soft.Config{})
	d2, _ := fab.NewNode(soft.Config{})
	t.Cleanup(func() { d1.Close(); d2.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	a, err := New(ctx, Config{Device: d1, Node: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if b, err = New(ctx, Config{Device: d2, Node: 2, Meta: []meta.Info{a.MetaInfo()}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for i, port := range []uint32{7, 9} {
		recvs[i], sends[i] = boundPortPair(ctx, t, b, a, port)
	}
	return ctx, b, recvs, sends
}

// sendTo sends 8 B on q and pops its completion.
func sendTo(ctx context.Context, t *testing.T, q *Queue, out *MR) {
	t.Helper()
	if err := q.PushOne(ctx, true, krcore.Request{Op: verbs.OpSend, Local: out.Range(0, 8)}); err != nil {
		t.Fatal(err)
	}
	var cs [1]krcore.Completion
	if _, err := q.PopWait(ctx, cs[:]); err != nil || cs[0].Status != verbs.Success {
		t.Fatalf("SEND: %v %v", err, cs[0].Status)
	}
}

// popper pops q's messages until ctx ends, one a receive on got.
func popper(ctx context.Context, q *Queue, got chan<- error) {
	var ms [1]krcore.Message
	for {
		_, err := q.PopMsgsWait(ctx, ms[:])
		if ctx.Err() != nil {
			return
		}
		got <- err
	}
}

// TestLendEndsForWaiterAside: a sleeper on the receive queue that leaves
// with the role lent (lend), while a waiter sleeps aside for the hand-over
// token, and does not come back leaves nobody on the queue; the lend ends
// (endLend) and the waiter aside takes the role and gets its message. With
// serveRecvs away for an hour, nothing else brings it.
func TestLendEndsForWaiterAside(t *testing.T) {
	ctx, b, recvs, sends := lendPair(t)
	out, err := sends[1].rt.RegMR(8, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	pl := b.recvs
	// Hold the role as a sleeper does before it publishes itself (so
	// that the waiter cannot displace it); serveRecvs, if it sleeps on
	// the queue, is kicked off it.
	for !pl.waitMu.TryLock() {
		b.kick(pl.own)
		if ctx.Err() != nil {
			t.Fatal("the receive queue's role never freed")
		}
		runtime.Gosched()
	}
	got := make(chan error, 1)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go popper(wctx, recvs[1], got)
	for pl.asideTok.Load() == 0 {
		if ctx.Err() != nil {
			pl.waitMu.Unlock()
			t.Fatal("the waiter never slept aside for the token")
		}
		time.Sleep(time.Millisecond)
	}
	pl.lend() // leaves, as a sleeper whose wait went well, and is not back
	pl.waitMu.Unlock()
	sendTo(ctx, t, sends[1], out)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the waiter aside never got its message: the lent role was never passed on")
	}
	if pl.lent.Load() {
		t.Error("still lent after the waiter aside took the role")
	}
}

// TestLenderDoesNotStarveOtherPort: one goroutine pops port 7 in a loop, a
// message at a time (a ping-pong's reader, which lends the role whenever
// a waiter sleeps aside), while another waits on port 9 of the same
// runtime: every message to port 9, those sent while the loop runs and
// one after it stopped, reaches its waiter.
func TestLenderDoesNotStarveOtherPort(t *testing.T) {
	ctx, _, recvs, sends := lendPair(t)
	outs := [2]*MR{}
	for i := range outs {
		var err error
		if outs[i], err = sends[i].rt.RegMR(8, verbs.AccessLocalWrite); err != nil {
			t.Fatal(err)
		}
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	pinged, other := make(chan error, 1), make(chan error, 1)
	go popper(wctx, recvs[1], other)
	lctx, stopLender := context.WithCancel(wctx)
	go popper(lctx, recvs[0], pinged)
	want := func(ch <-chan error, what string, i int) {
		t.Helper()
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("round %d: %s: %v", i, what, err)
			}
		case <-ctx.Done():
			t.Fatalf("round %d: no %s: its waiter starved", i, what)
		}
	}
	const rounds = 2000
	for i := range rounds {
		sendTo(ctx, t, sends[0], outs[0])
		if i%50 == 25 {
			sendTo(ctx, t, sends[1], outs[1])
			want(other, "message to the other port", i)
		}
		want(pinged, "ping", i)
	}
	stopLender()
	sendTo(ctx, t, sends[1], outs[1])
	want(other, "message to the other port after the loop stopped", rounds)
}
