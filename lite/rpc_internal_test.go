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

// forger sends raw WRITE_WITH_IMMs from one node to the LITE port of
// another, into a region the target exports for the purpose.
type forger struct {
	t   *testing.T
	q   krcore.VQ
	buf krcore.MR
	dst krcore.Region
}

func newForger(ctx context.Context, t *testing.T, from, to krcore.API) *forger {
	t.Helper()
	target, _ := to.RegMR(2*rpcSlotSize, verbs.AccessAll)
	name := freshName("forge", from.Node())
	if err := to.Export(name, target, 0, target.Len(), verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	q, _ := from.Queue()
	t.Cleanup(func() { q.Close() })
	if err := q.Connect(ctx, to.Node(), &krcore.ConnectOptions{Port: DefaultPort}); err != nil {
		t.Fatal(err)
	}
	dst, err := q.Region(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := from.RegMR(2*rpcSlotSize, verbs.AccessLocalWrite)
	return &forger{t: t, q: q, buf: buf, dst: dst}
}

// write WRITE_WITH_IMMs n bytes with immediate v.
func (f *forger) write(ctx context.Context, n int, v imm) {
	f.t.Helper()
	req := krcore.Request{ID: 1, Op: verbs.OpWriteImm, Local: f.buf.Range(0, n), Remote: f.dst.At(0), Imm: v.encode()}
	if _, err := f.q.Push(ctx, true, req); err != nil {
		f.t.Fatal(err)
	}
	var wc [1]krcore.Completion
	if _, err := f.q.PopWait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
		f.t.Fatalf("forged write: %v %v", err, wc[0].Err())
	}
}

// waitDropped waits until n has dropped want notifications in all.
func waitDropped(ctx context.Context, t *testing.T, n *Node, want uint64) {
	t.Helper()
	for n.rpc.dropped.Load() < want {
		if ctx.Err() != nil {
			t.Fatalf("%d notifications dropped, want %d", n.rpc.dropped.Load(), want)
		}
		time.Sleep(time.Millisecond) // polling a counter serve raises
	}
	if got := n.rpc.dropped.Load(); got != want {
		t.Fatalf("%d notifications dropped, want %d", got, want)
	}
}

// TestForgedNotifications: WRITE_WITH_IMM notifications that do not check
// out are dropped and counted, never a panic or a wrong wake-up: a request
// from a node with no ring, a slot out of range, a length larger than a
// slot or shorter than a header, a reply from a third node for someone
// else's call, a reply for a slot not in flight or of another generation.
// The call they aimed at still gets its own reply.
func TestForgedNotifications(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	api1, api2, api3 := core.Embed(c.Node(1)), core.Embed(c.Node(2)), core.Embed(c.Node(3))
	var nodes [4]*Node
	for i, api := range []krcore.API{api1, api2, api3} {
		if nodes[i+1], err = Open(ctx, api, Options{}); err != nil {
			t.Fatal(err)
		}
		defer nodes[i+1].Close()
	}
	caller, server, third := nodes[1], nodes[2], nodes[3]
	svc, err := server.RegisterRPC(1)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		k   int
		err error
	}
	done := make(chan result, 1)
	resp := make([]byte, 16)
	go func() {
		k, err := caller.Call(ctx, 2, 1, []byte("question"), resp)
		done <- result{k, err}
	}()
	call, err := svc.Recv(ctx) // the call waits in slot call.slot
	if err != nil {
		t.Fatal(err)
	}
	if _, err := third.Call(ctx, 2, 9, nil, nil); !errors.Is(err, ErrNoService) { // node 3 gets a ring at node 2
		t.Fatalf("third node's call: %v", err)
	}
	epoch := call.ring.epoch
	server.rpc.mu.Lock()
	thirdEpoch := server.rpc.rings[3].epoch
	server.rpc.mu.Unlock()

	// At the server: requests that do not check out.
	at2 := newForger(ctx, t, api1, api2) // from the caller's node
	at2.write(ctx, rpcHdr, imm{kind: immRequest, slot: 0, epoch: epoch + 1, gen: 1})
	from3 := newForger(ctx, t, api3, api2)
	from3.write(ctx, rpcHdr, imm{kind: immRequest, slot: 40, epoch: thirdEpoch, gen: 1})
	from3.write(ctx, rpcSlotSize+1, imm{kind: immRequest, slot: 0, epoch: thirdEpoch, gen: 1})
	from3.write(ctx, rpcHdr-1, imm{kind: immRequest, slot: 0, epoch: thirdEpoch, gen: 1})
	from3.write(ctx, rpcHdr, imm{kind: 0, slot: 0, epoch: thirdEpoch, gen: 1})
	waitDropped(ctx, t, server, 5)

	// At the caller: replies that do not check out.
	v := imm{kind: immReply, slot: call.slot, epoch: epoch, gen: call.gen}
	newForger(ctx, t, api3, api1).write(ctx, 8, v) // a third node answers the call
	at1 := newForger(ctx, t, api2, api1)           // the server's node, but wrong
	at1.write(ctx, 8, imm{kind: immReply, slot: call.slot + 1, epoch: epoch, gen: call.gen})
	at1.write(ctx, 8, imm{kind: immReply, slot: call.slot, epoch: epoch, gen: call.gen + 1})
	at1.write(ctx, 8, imm{kind: immReply, slot: call.slot, epoch: epoch + 1, gen: call.gen})
	at1.write(ctx, rpcSlotSize+1, v)
	at1.write(ctx, len(resp)+1, v) // more than the caller takes
	at1.write(ctx, errReplyLen-1, imm{kind: immError, slot: call.slot, epoch: epoch, gen: call.gen})
	waitDropped(ctx, t, caller, 7)
	select {
	case r := <-done:
		t.Fatalf("a forged reply completed the call: %d bytes, %v", r.k, r.err)
	default:
	}

	if err := svc.Reply(ctx, call, []byte("answer")); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || string(resp[:r.k]) != "answer" {
		t.Fatalf("the call's own reply: %q %v", resp[:r.k], r.err)
	}
	if err := svc.Reply(ctx, call, []byte("again")); !errors.Is(err, krcore.ErrInvalid) {
		t.Fatalf("a second Reply to one call: %v, want ErrInvalid", err)
	}
}

// TestRPCServerDies: a caller whose server's node dies gets an error
// within a bound, whether its call waits for a reply (the call timeout)
// or starts after the death (the WRITE's completion error or the timeout).
func TestRPCServerDies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	server, err := Open(ctx, core.Embed(c.Node(2)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	const timeout = time.Second
	caller, err := Open(ctx, core.Embed(c.Node(1)), Options{CallTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer caller.Close()
	svc, err := server.RegisterRPC(1)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := caller.Call(context.Background(), 2, 1, []byte("q"), nil); errc <- err }()
	if _, err := svc.Recv(ctx); err != nil { // held, never answered
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Remove(2, true); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call waiting on a server that died: %v, want its deadline", err)
	}
	for range 2 {
		if _, err := caller.Call(context.Background(), 2, 1, []byte("q"), nil); err == nil {
			t.Fatal("a call to a dead node succeeded")
		} else {
			t.Logf("call after the death: %v", err)
		}
	}
	if d := time.Since(start); d > 3*timeout+2*time.Second {
		t.Fatalf("three calls to a dead server took %v", d)
	}
}

// TestRPCCloseReleases: Close withdraws the rings and reply areas a Node
// exported (a Region lookup of them fails) and closes every queue its RPC
// made, at the callee and the caller.
func TestRPCCloseReleases(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	api1, api2 := core.Embed(c.Node(1)), core.Embed(c.Node(2))
	before1, before2 := api1.Stats().VQs, api2.Stats().VQs
	server, err := Open(ctx, api2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	caller, err := Open(ctx, api1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := server.RegisterRPC(1)
	go func() {
		c, err := svc.Recv(ctx)
		for err == nil {
			c, err = svc.ReplyRecv(ctx, c, c.Req)
		}
	}()
	for range 4 {
		if _, err := caller.Call(ctx, 2, 1, []byte("x"), make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
	ring, reply := server.rpc.rings[1].export, caller.rpc.sessions[2].replyAs
	// asked looks name up at node as api's queue bound to port.
	asked := func(api krcore.API, port uint32, node krcore.NodeID, name string) error {
		q, err := api.Queue()
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		if err := q.Bind(port); err != nil {
			t.Fatal(err)
		}
		if err := q.Connect(ctx, node, nil); err != nil {
			t.Fatal(err)
		}
		_, err = q.Region(ctx, name)
		return err
	}
	// The ring and the reply area are the two Nodes' alone: another
	// process that learned their names finds neither.
	if err := asked(api1, DefaultPort+1, 2, ring); !errors.Is(err, krcore.ErrNoRegion) {
		t.Fatalf("the ring asked by another port of the caller's node: %v, want ErrNoRegion", err)
	}
	if err := asked(api2, DefaultPort+1, 1, reply); !errors.Is(err, krcore.ErrNoRegion) {
		t.Fatalf("the reply area asked by another port of the callee's node: %v, want ErrNoRegion", err)
	}
	server.Close()
	caller.Close()
	// Asked as the principal each was exported to (the LITE port, free
	// again).
	if err := asked(api1, DefaultPort, 2, ring); !errors.Is(err, krcore.ErrNoRegion) {
		t.Fatalf("the ring after the callee closed: %v, want ErrNoRegion", err)
	}
	if err := asked(api2, DefaultPort, 1, reply); !errors.Is(err, krcore.ErrNoRegion) {
		t.Fatalf("the reply area after the caller closed: %v, want ErrNoRegion", err)
	}
	if got1, got2 := api1.Stats().VQs, api2.Stats().VQs; got1 != before1 || got2 != before2 {
		t.Fatalf("VQs after Close: %d and %d, %d and %d before Open", got1, got2, before1, before2)
	}
}
