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
