package lite

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// TestCloseDuringAtomic: Close while FetchAdds wait on a master that was
// killed wakes them and leaves no queue of the sync path behind.
func TestCloseDuringAtomic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	api := core.Embed(c.Node(1))
	before := api.Stats().VQs
	master, err := Open(ctx, core.Embed(c.Node(2)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := master.Malloc(ctx, "w", 8, Atomic); err != nil {
		t.Fatal(err)
	}
	mapper, err := Open(ctx, api, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := mapper.Map(ctx, 2, "w", Atomic)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mapper.FetchAdd(ctx, h, 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(2, true); err != nil { // the master's node dies
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !mapper.isClosed() {
			mapper.FetchAdd(ctx, h, 0, 1)
		}
	}()
	for mapper.sync.mu.TryLock() { // until a FetchAdd holds the sync queue
		mapper.sync.mu.Unlock()
	}
	mapper.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a FetchAdd still waits 5 s after Close")
	}
	if got := api.Stats().VQs; got != before {
		t.Fatalf("%d VQs after Close, %d before Open", got, before)
	}
}
