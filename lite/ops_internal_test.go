package lite

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// TestCloseStopsOps: Close cancels a long request's goroutine (spawn),
// waits for it, and closes the queues remote copies pooled: no VQ is left.
func TestCloseStopsOps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	api := core.Embed(c.Node(1))
	before := api.Stats().VQs
	n, err := Open(ctx, api, Options{})
	if err != nil {
		t.Fatal(err)
	}
	q, err := n.takeQueue(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	n.putQueue(q)
	started, ended := make(chan struct{}), make(chan error, 1)
	n.spawn(n.ops.ctx, krcore.Principal{Node: 2, Port: DefaultPort}, ctlMsg{kind: opMemcpy}, func(ctx context.Context, _ krcore.Principal, _ ctlMsg) reply {
		close(started)
		<-ctx.Done() // a copy waiting on a peer that never answers
		ended <- ctx.Err()
		return reply{}
	})
	<-started
	start := time.Now()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the goroutine ended without its context ending")
		}
	default:
		t.Fatal("Close returned before the goroutine it owns ended")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if got := api.Stats().VQs; got != before {
		t.Fatalf("%d VQs after Close, %d before Open", got, before)
	}
}
