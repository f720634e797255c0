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

// TestStaleReply: a reply owed to a Node that had the port before (its
// request timed out, the Node closed) reaches the Node opened on the port
// since; it must not answer that Node's request, which the same master
// holds. Both Nodes count their request ids, so from the same start they
// would match.
func TestStaleReply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	master := core.Embed(c.Node(2))
	mute, _ := master.Queue() // the master's port: takes Maps, answers late
	defer mute.Close()
	if err := mute.Bind(DefaultPort); err != nil {
		t.Fatal(err)
	}
	evil, _ := master.RegMR(64, verbs.AccessAll)
	if err := master.Export("evil", evil, 0, 64, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	mapAsync := func(n *Node, d time.Duration) (<-chan error, uint64) {
		errc := make(chan error, 1)
		go func() {
			mctx, mcancel := context.WithTimeout(ctx, d)
			defer mcancel()
			_, err := n.Map(mctx, 2, "table", Read)
			errc <- err
		}()
		var msg [1]krcore.Message
		if _, err := mute.PopMsgsWait(ctx, msg[:]); err != nil {
			t.Fatal(err)
		}
		req, _ := decode(msg[0].Data)
		return errc, req.id
	}
	old, err := Open(ctx, core.Embed(c.Node(1)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	errc, oldID := mapAsync(old, 100*time.Millisecond)
	<-errc
	old.Close()
	fresh, err := Open(ctx, core.Embed(c.Node(1)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	errc, _ = mapAsync(fresh, time.Second)

	q, _ := master.Queue()
	defer q.Close()
	if err := q.Connect(ctx, 1, &krcore.ConnectOptions{Port: DefaultPort}); err != nil {
		t.Fatal(err)
	}
	out, _ := master.RegMR(slotSize, verbs.AccessLocalWrite)
	k := ctlMsg{kind: opReply, id: oldID, code: codeOK, name: "evil"}.encode(out.Bytes())
	if _, err := q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: out.Range(0, k)}); err != nil {
		t.Fatal(err)
	}
	var wc [1]krcore.Completion
	if _, err := q.PopWait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
		t.Fatalf("late reply: %v %v", err, wc[0].Err())
	}
	if err := <-errc; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the new Node's Map took the old Node's reply: %v, want its deadline", err)
	}
}
