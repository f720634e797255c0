package lite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestForgedReply: a third node that answers a Map in the master's place,
// guessing the request id, does not hand the mapper an export of its
// choosing: the Map waits for the master and ends at its deadline.
func TestForgedReply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	master, forger := core.Embed(c.Node(2)), core.Embed(c.Node(3))
	// The master's port takes the Map and never answers; it exports a
	// region under a name the forger picks.
	mute, _ := master.Queue()
	defer mute.Close()
	if err := mute.Bind(DefaultPort); err != nil {
		t.Fatal(err)
	}
	evil, _ := master.RegMR(64, verbs.AccessAll)
	if err := master.Export("evil", evil, 0, 64, verbs.AccessRemoteRead|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	mapper, err := Open(ctx, core.Embed(c.Node(1)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mapper.Close()
	mctx, mcancel := context.WithTimeout(ctx, time.Second)
	defer mcancel()
	errc := make(chan error, 1)
	go func() {
		_, err := mapper.Map(mctx, 2, "table", Read)
		errc <- err
	}()
	var msg [1]krcore.Message
	if _, err := mute.PopMsgsWait(ctx, msg[:]); err != nil { // the Map waits now
		t.Fatal(err)
	}
	q, _ := forger.Queue()
	defer q.Close()
	if err := q.Connect(ctx, 1, &krcore.ConnectOptions{Port: DefaultPort}); err != nil {
		t.Fatal(err)
	}
	out, _ := forger.RegMR(slotSize, verbs.AccessLocalWrite)
	for id := uint64(1); id <= 8; id++ {
		k := ctlMsg{kind: opReply, id: id, code: codeOK, name: "evil"}.encode(out.Bytes())
		if _, err := q.Push(ctx, true, krcore.Request{ID: id, Op: verbs.OpSend, Local: out.Range(0, k)}); err != nil {
			t.Fatal(err)
		}
		var wc [1]krcore.Completion
		if _, err := q.PopWait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
			t.Fatalf("forged reply %d: %v %v", id, err, wc[0].Err())
		}
	}
	if err := <-errc; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Map answered by a third node: %v, want its deadline", err)
	}
}

// TestForgedRPCReply: another process of the callee's node (a queue of
// the callee's runtime that is not the callee's Node) WRITE_WITH_IMMs a
// region of the caller's node open to it and aims the notification at a
// waiting call's reply port with the call's slot, epoch and generation.
// The notification comes from the callee's node, as the callee's own
// replies do (from queues that hold no port); the call must not take it
// (it would return whatever its reply slot held) and takes the callee's
// reply after it.
func TestForgedRPCReply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := newRPCRig(ctx, t)
	c, callerAPI, caller, svc := r.c, r.callerAPI, r.caller, r.svc
	forger := core.Embed(c.Node(2))
	open, _ := callerAPI.RegMR(64, verbs.AccessAll)
	if err := callerAPI.Export("open", open, 0, 64, verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	type result struct {
		resp []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp := make([]byte, 16)
		k, err := caller.Call(ctx, 2, 1, []byte("question"), resp)
		done <- result{resp[:max(k, 0)], err}
	}()
	call, err := svc.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q, _ := forger.Queue()
	defer q.Close()
	if err := q.Connect(ctx, 1, &krcore.ConnectOptions{Port: call.port}); err != nil {
		t.Fatal(err)
	}
	region, err := q.Region(ctx, "open")
	if err != nil {
		t.Fatal(err)
	}
	src, _ := forger.RegMR(64, verbs.AccessLocalWrite)
	dropped := caller.rpc.dropped.Load()
	v := imm{kind: immReply, slot: call.slot, epoch: call.ring.epoch, gen: call.gen}
	if _, err := q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpWriteImm, Local: src.Range(0, 16), Remote: region.At(0), Imm: v.encode()}); err != nil {
		t.Fatal(err)
	}
	var wc [1]krcore.Completion
	if _, err := q.PopWait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
		t.Fatalf("the forged WRITE_WITH_IMM: %v %v", err, wc[0].Err())
	}
	// The call takes the notification off its queue: it is refused
	// (counted), or, were it taken, the call returns.
	for caller.rpc.dropped.Load() == dropped {
		select {
		case r := <-done:
			t.Fatalf("the call took a forged reply: %q, %v", r.resp, r.err)
		case <-ctx.Done():
			t.Fatal("the forged notification was neither refused nor taken")
		case <-time.After(time.Millisecond):
		}
	}
	if err := svc.Reply(ctx, call, []byte("answer")); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || string(r.resp) != "answer" {
		t.Fatalf("the call: %q, %v; want the callee's answer", r.resp, r.err)
	}
}
