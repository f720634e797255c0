package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
)

// TestPopAnyWaitBehindPopMsgsWait: a PopAnyWait queued for the message
// bell behind a PopMsgsWait that sleeps there (one sleeper per bell) gets
// a completion that comes meanwhile: the daemon rings the bell, and the
// PopMsgsWait, finding no message but a completion and a PopAnyWait
// waiting, leaves the bell to it and sleeps again behind it.
func TestPopAnyWaitBehindPopMsgsWait(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	q, req := read8(t, e, "daemon")

	msgCtx, stopMsgs := context.WithCancel(ctx)
	msgDone := make(chan error, 1)
	go func() {
		_, err := q.PopMsgsWait(msgCtx, make([]krcore.Message, 1))
		msgDone <- err
	}()
	defer func() {
		stopMsgs()
		if err := <-msgDone; !errors.Is(err, context.Canceled) {
			t.Errorf("PopMsgsWait with no message to come: %v, want Canceled", err)
		}
	}()
	time.Sleep(10 * time.Millisecond) // the PopMsgsWait falls asleep first

	type res struct {
		nc, nm int
		err    error
	}
	anyDone := make(chan res, 1)
	out := make([]krcore.Completion, 1)
	go func() {
		nc, nm, err := q.PopAnyWait(ctx, out, make([]krcore.Message, 1))
		anyDone <- res{nc, nm, err}
	}()
	time.Sleep(10 * time.Millisecond) // and the PopAnyWait queues behind it
	req.ID = 9
	if err := q.PushOne(ctx, false, req); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-anyDone:
		if r.err != nil || r.nc != 1 || r.nm != 0 || out[0].ID != 9 || out[0].Err() != nil {
			t.Fatalf("PopAnyWait: %+v, completion %+v", r, out[0])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("PopAnyWait behind a PopMsgsWait did not get its completion")
	}
}
