package core_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestRecvWaiterRests: while an application spins on PopMsgs (which
// dispatches every message it finds), the runtime's receive waiter rests
// off the receive queue instead of being woken for every message; a
// goroutine that then goes to sleep in a wait that relies on another's
// dispatch (PopAnyWait sleeps on the send queue) ends the rest at once, so
// its message is not left waiting for the rest's round, set here to an
// hour.
func TestRecvWaiterRests(t *testing.T) {
	old := core.SetRestRound(time.Hour)
	t.Cleanup(func() { core.SetRestRound(old) }) // after the cluster's close: its waiter reads it
	c := start(t, 2, core.Config{})
	a, b := c.Node(1), c.Node(2)
	srv, cli := portPair(t, c)
	msg, _ := a.RegMR(64, verbs.AccessLocalWrite)
	send := func(id uint64) {
		t.Helper()
		if err := cli.PushOne(ctx(t), true, krcore.Request{ID: id, Op: verbs.OpSend, Local: msg.Range(0, 8)}); err != nil {
			t.Fatal(err)
		}
		if wc := pop1(t, cli); wc.Status != verbs.Success {
			t.Fatalf("SEND %d: %v", id, wc.Status)
		}
	}
	var msgs [1]krcore.Message
	deadline := time.Now().Add(10 * time.Second)
	for id := uint64(1); !core.Resting(b); id++ {
		if time.Now().After(deadline) {
			t.Fatalf("the receive waiter never rested in %d messages polled by PopMsgs", id)
		}
		send(id)
		for srv.PopMsgs(msgs[:]) == 0 {
			runtime.Gosched() // as a spinning application in one process does (krbench's Poll)
			if time.Now().After(deadline) {
				t.Fatalf("message %d never came (stats %+v)", id, b.Stats())
			}
		}
	}
	// A sleeper on the send queue, whose message only a poll of the
	// receive queue dispatches.
	got := make(chan error, 1)
	go func() {
		out := make([]krcore.Completion, 1)
		wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, nm, err := srv.PopAnyWait(wctx, out, msgs[:])
		if err == nil && nm != 1 {
			err = context.DeadlineExceeded
		}
		got <- err
	}()
	for core.Sleepers(b) == 0 {
		time.Sleep(time.Millisecond)
	}
	send(1 << 20)
	if err := <-got; err != nil {
		t.Fatalf("a waiter asleep on the send queue did not get its message while the receive waiter rested: %v", err)
	}
}
