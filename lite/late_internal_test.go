package lite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestLateReplyFreesSlotOnRetire: a call gave up before its reply came;
// the reply lands later in the inbox of the queue the call waited on,
// idle in the pool. When that queue is retired (evicted, or the pool
// closes it) the reply is taken first, and frees the call's slot: lost,
// the slot would stay taken until every slot was so and the session was
// torn down.
func TestLateReplyFreesSlotOnRetire(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := newRPCRig(ctx, t)
	c, caller, callee, svc := r.c, r.caller, r.callee, r.svc
	gaveUp := make(chan error, 1)
	go func() {
		cctx, ccancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer ccancel()
		_, err := caller.Call(cctx, 2, 1, []byte("question"), make([]byte, 16))
		gaveUp <- err
	}()
	call, err := svc.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-gaveUp; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the call that gives up: %v", err)
	}
	caller.rpc.mu.Lock()
	s := caller.rpc.sessions[2]
	caller.rpc.mu.Unlock()
	if free := len(s.free); free != rpcSlots-1 {
		t.Fatalf("%d slots free while the call's is held, want %d", free, rpcSlots-1)
	}
	if err := svc.Reply(ctx, call, []byte("late")); err != nil {
		t.Fatal(err)
	}
	// The reply's WRITE completed at the callee: its notification is on
	// the caller's receive queue.
	cp := &callee.rpc.pool
	back, err := cp.idle1(krcore.Principal{Node: 1, Port: call.port})
	if err != nil || back == nil {
		t.Fatalf("the callee's reply queue: %v %v", back, err)
	}
	if back.owed {
		if err := cp.reap(ctx, back); err != nil {
			t.Fatalf("the late reply's WRITE: %v", err)
		}
	}
	marker(ctx, t, core.Embed(c.Node(2)), core.Embed(c.Node(1)))
	p := &caller.rpc.pool
	e, err := p.idle1(krcore.Principal{Node: 2, Port: callee.port})
	if err != nil || e == nil {
		t.Fatalf("the queue the call waited on: %v %v", e, err)
	}
	p.retire(e)
	if free := len(s.free); free != rpcSlots {
		t.Fatalf("%d slots free after the queue holding the late reply retired, want %d", free, rpcSlots)
	}
}

// marker SENDs a message from node from to a port of node to and waits
// for it there: to's runtime has then dispatched every message that
// reached its receive queue before (one queue, in order), and a message
// from from completed before the marker was sent had.
func marker(ctx context.Context, t *testing.T, from, to krcore.API) {
	t.Helper()
	const port = 77
	in, _ := to.Queue()
	defer in.Close()
	if err := in.Bind(port); err != nil {
		t.Fatal(err)
	}
	buf, _ := to.RegMR(64, verbs.AccessLocalWrite)
	defer to.Deregister(buf)
	if err := in.PushRecv(buf.Range(0, 64)); err != nil {
		t.Fatal(err)
	}
	out, _ := from.Queue()
	defer out.Close()
	if err := out.Connect(ctx, to.Node(), &krcore.ConnectOptions{Port: port}); err != nil {
		t.Fatal(err)
	}
	src, _ := from.RegMR(64, verbs.AccessLocalWrite)
	defer from.Deregister(src)
	if _, err := out.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: src.Range(0, 8)}); err != nil {
		t.Fatal(err)
	}
	var m [1]krcore.Message
	if _, err := in.PopMsgsWait(ctx, m[:]); err != nil || m[0].Status != verbs.Success {
		t.Fatalf("marker: %v %v", err, m[0].Status)
	}
	var wc [1]krcore.Completion
	if _, err := out.PopWait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
		t.Fatalf("marker's SEND: %v %v", err, wc[0].Err())
	}
}
