package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/daemon/wire"
)

// TestBindGivenUp: a Bind whose caller stopped waiting and that the daemon
// then answers with success is unbound before the queue's next Bind goes
// out, so that the undoing of the first cannot unbind the second (the
// undo went out after it, and left a queue its caller was told was bound
// unbound). The daemon here is the test: it holds the first Bind's answer
// until the call has given up, and checks the order of what comes next.
func TestBindGivenUp(t *testing.T) {
	sock, ln := fakeDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type step struct {
		m   *wire.Msg
		err error
	}
	got := make(chan step, 8)
	answer := make(chan *wire.Msg, 8)
	go func() { // the daemon: HELLO and OpQueue answered at once, the rest as the test says
		conn, err := ln.AcceptUnix()
		if err != nil {
			got <- step{err: err}
			return
		}
		defer conn.Close()
		for {
			m, err := wire.Recv(conn)
			if err != nil {
				got <- step{err: err}
				return
			}
			m.CloseFDs()
			switch m.Op {
			case wire.OpHello:
				wire.Send(conn, helloReply(m))
			case wire.OpQueue:
				wire.Send(conn, m.Reply().U64(5))
			default:
				got <- step{m: m}
				select {
				case r := <-answer:
					wire.Send(conn, r)
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	// The first Bind gives up after the call timeout; the second has as
	// long for its turn and its answer, which take milliseconds.
	c, err := client.Attach(ctx, client.Options{Socket: sock, CallTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q, err := c.Queue()
	if err != nil {
		t.Fatal(err)
	}
	next := func() *wire.Msg {
		t.Helper()
		select {
		case s := <-got:
			if s.err != nil {
				t.Fatal(s.err)
			}
			return s.m
		case <-ctx.Done():
			t.Fatal("the fake daemon got nothing")
		}
		return nil
	}
	if err := q.Bind(7); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a Bind the daemon does not answer: %v, want DeadlineExceeded", err)
	}
	first := next()
	second := make(chan error, 1)
	go func() { second <- q.Bind(7) }()
	answer <- first.Reply() // bound, late
	for _, want := range []wire.Op{wire.OpUnbind, wire.OpBind} {
		m := next()
		if m.Op != want {
			t.Fatalf("after the first Bind's late success the daemon got op %d, want %d (OpUnbind, then the second OpBind)", m.Op, want)
		}
		answer <- m.Reply()
	}
	if err := <-second; err != nil {
		t.Fatalf("the second Bind: %v", err)
	}
}
