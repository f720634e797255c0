package lite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/poprole"
)

// poppedBy is who pops n's port now.
func (n *Node) poppedBy() poprole.State {
	return n.pop.State()
}

// serveEchoes answers svc's calls with their requests until it closes.
func serveEchoes(svc *Service) {
	ctx := context.Background()
	c, err := svc.Recv(ctx)
	for err == nil {
		c, err = svc.ReplyRecv(ctx, c, c.Req)
	}
}

// TestRecvPopsPort: a service's Recv waiting with nothing queued pops the
// Node's port itself (the role is Popping), so that a call reaches it
// with no serving goroutine between; calls are answered all along.
func TestRecvPopsPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := newRPCRig(ctx, t)
	go serveEchoes(r.svc)
	var resp [8]byte
	for i := 0; ; i++ {
		if _, err := r.caller.Call(ctx, 2, 1, []byte("ping"), resp[:]); err != nil {
			t.Fatal(err)
		}
		// The server takes the role on its next Recv, unless the serving
		// goroutine took it back first (LendFor, on a loaded machine):
		// then the next call hands it over again.
		for range 50 {
			if r.callee.poppedBy() == poprole.Popping {
				return
			}
			time.Sleep(time.Millisecond)
		}
		if i == 200 {
			t.Fatalf("after %d calls, the role is %d, never the waiting Recv's (%d)", i, r.callee.poppedBy(), poprole.Popping)
		}
	}
}

// TestLentRoleServed: a service that took a call and does not Recv again
// keeps the role lent, and its Node's port is still served: a control
// request it makes itself (setting up a session for a call of its own) is
// answered, and so is a call to another service whose Recv waits, both
// within a bound (the serving goroutine takes the role back); the held
// call is answered after.
func TestLentRoleServed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := newRPCRig(ctx, t)
	other, err := r.callee.RegisterRPC(2)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	go serveEchoes(other)
	back, err := r.caller.RegisterRPC(3) // the held call's handler calls the caller
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	go serveEchoes(back)

	errc := make(chan error, 1)
	go func() { _, err := r.caller.Call(ctx, 2, 1, []byte("held"), nil); errc <- err }()
	held, err := r.svc.Recv(ctx) // and no Recv after it
	if err != nil {
		t.Fatal(err)
	}
	var resp [8]byte
	bound, cancelBound := context.WithTimeout(ctx, 5*time.Second)
	defer cancelBound()
	if k, err := r.callee.Call(bound, 1, 3, []byte("back"), resp[:]); err != nil || string(resp[:k]) != "back" {
		t.Fatalf("a call from the service holding a call: %q, %v", resp[:k], err)
	}
	if k, err := r.caller.Call(bound, 2, 2, []byte("other"), resp[:]); err != nil || string(resp[:k]) != "other" {
		t.Fatalf("a call to another service while the role is lent: %q, %v", resp[:k], err)
	}
	if err := r.svc.Reply(ctx, held, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("the held call: %v", err)
	}
}

// TestPoppingRecvEnds: a Recv popping the port returns its context's
// error when that ends, and krcore.ErrClosed when its service closes;
// the port is served after either (a call to the service's next Recv is
// answered).
func TestPoppingRecvEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := newRPCRig(ctx, t)
	var resp [8]byte
	// One call through, so that the role is free for the next Recv.
	go func() {
		if c, err := r.svc.Recv(ctx); err == nil {
			r.svc.Reply(ctx, c, nil)
		}
	}()
	if _, err := r.caller.Call(ctx, 2, 1, nil, resp[:]); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := r.svc.Recv(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv past its deadline: %v", err)
	}
	go serveEchoes(r.svc)
	if k, err := r.caller.Call(ctx, 2, 1, []byte("after"), resp[:]); err != nil || string(resp[:k]) != "after" {
		t.Fatalf("a call after a Recv's deadline: %q, %v", resp[:k], err)
	}

	svc2, err := r.callee.RegisterRPC(2)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := svc2.Recv(ctx); done <- err }()
	time.Sleep(10 * time.Millisecond) // let it wait, popping or not: either way Close ends it
	svc2.Close()
	select {
	case err := <-done:
		if !errors.Is(err, krcore.ErrClosed) {
			t.Fatalf("Recv of a closed service: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close did not end a waiting Recv")
	}
	if k, err := r.caller.Call(ctx, 2, 1, []byte("again"), resp[:]); err != nil || string(resp[:k]) != "again" {
		t.Fatalf("a call after a Recv's service closed: %q, %v", resp[:k], err)
	}
}

// TestCallSeesFailedWrite: a caller waits for its reply alone while its
// WRITE's completion is owed (waitReply), polling the completion at each
// slice's end: a WRITE that fails still ends the call long before its
// deadline. Here the callee's Node restarts, which withdraws the caller's
// ring: the next call's WRITE fails (REM_ACCESS_ERR) and the call goes on
// in a new ring, well within its 20 s bound.
func TestCallSeesFailedWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := newRPCRig(ctx, t)
	go serveEchoes(r.svc)
	var resp [8]byte
	if _, err := r.caller.Call(ctx, 2, 1, []byte("first"), resp[:]); err != nil {
		t.Fatal(err)
	}
	r.callee.Close()
	callee, err := Open(ctx, core.Embed(r.c.Node(2)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer callee.Close()
	svc, err := callee.RegisterRPC(1)
	if err != nil {
		t.Fatal(err)
	}
	go serveEchoes(svc)
	bound, cancelBound := context.WithTimeout(ctx, 20*time.Second)
	defer cancelBound()
	start := time.Now()
	if k, err := r.caller.Call(bound, 2, 1, []byte("again"), resp[:]); err != nil || string(resp[:k]) != "again" {
		t.Fatalf("a call after the callee restarted: %q, %v", resp[:k], err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a call whose WRITE failed took %v to go on in a new ring", d)
	}
}

// TestQueueMarksOnlyPushed: the popping Recv's batch marks (its own call
// claimed, a call handed on) follow a push that succeeded. A call refused
// by a closed queue neither ends the popping Recv's wait as its own nor
// leaves the role lent, for up to LendFor, to a Recv with nothing to take.
func TestQueueMarksOnlyPushed(t *testing.T) {
	n := &Node{pop: newPopRole()}
	r := &n.pop
	own, other := newCallQueue(0), newCallQueue(0)
	own.close()
	other.close()
	r.claim = &own
	if ok, _ := n.queue(&own, &Call{}); ok || r.claimed {
		t.Fatalf("own closed queue: pushed %v, claimed %v; want false, false", ok, r.claimed)
	}
	if ok, _ := n.queue(&other, &Call{}); ok || r.handedOff {
		t.Fatalf("other closed queue: pushed %v, handed off %v; want false, false", ok, r.handedOff)
	}

	own, other = newCallQueue(0), newCallQueue(0)
	if ok, ackNow := n.queue(&own, &Call{}); !ok || !ackNow || !r.claimed || r.handedOff {
		t.Fatalf("own queue: pushed %v, ack now %v, claimed %v, handed off %v; want true, true, true, false", ok, ackNow, r.claimed, r.handedOff)
	}
	select {
	case <-own.ready:
		t.Fatal("the popping Recv's own call woke its queue")
	default:
	}
	if ok, _ := n.queue(&other, &Call{}); !ok || !r.handedOff {
		t.Fatalf("other queue: pushed %v, handed off %v; want true, true", ok, r.handedOff)
	}
	select {
	case <-other.ready:
	default:
		t.Fatal("a call handed on did not wake its queue")
	}
}
