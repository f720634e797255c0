package lite

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// TestCloseDuringRead: Close while Reads wait on a master that was killed
// wakes them, and leaves no queue behind: a Read woken by the closing of
// its queue does not make a new one for a closed Node.
func TestCloseDuringRead(t *testing.T) {
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
	if _, err := master.Malloc(ctx, "t", 64, Read); err != nil {
		t.Fatal(err)
	}
	mapper, err := Open(ctx, api, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := mapper.Map(ctx, 2, "t", Read)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(2, true); err != nil { // the master's node dies
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 8)
		for !mapper.isClosed() {
			mapper.Read(ctx, h, 0, buf)
		}
	}()
	for mapper.dataMu.TryLock() { // until a Read holds the data queue
		mapper.dataMu.Unlock()
	}
	start := time.Now()
	mapper.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a Read still waits 5 s after Close")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if got := api.Stats().VQs; got != before {
		t.Fatalf("%d VQs after Close, %d before Open", got, before)
	}
}
