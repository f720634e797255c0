package lite_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/lite"
)

// TestNodeIDReused: a mapper's process exits and a new one comes up under
// the same node id (krbench's lite-locker run twice with one -node hung on
// its first Map: the master answered the former life). HotOps 1: the
// lock's atomics make each life build an RC QP to the master, which the
// next life knows nothing of. Each life opens the master's lock, locks
// and maps its LMR within a bound of a few RNIC retry timeouts.
func TestNodeIDReused(t *testing.T) {
	ctx := ctxT(t)
	cfg := cluster.Config{Nodes: 1, Runtime: core.Config{HotOps: 1}}
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	master := open(t, core.Embed(c.Node(1)))
	l, err := master.Malloc(ctx, "table", 4096, lite.Read)
	if err != nil {
		t.Fatal(err)
	}
	copy(l.Bytes(), "lives")
	lk, err := master.NewLock(ctx, "reuse")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close(ctx)
	for life := 0; life < 3; life++ {
		if err := c.Add(ctx, cfg, 2); err != nil {
			t.Fatal(err)
		}
		bound, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := lite.Open(bound, core.Embed(c.Node(2)), lite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ol, err := n.OpenLock(bound, 1, "reuse")
		if err != nil {
			t.Fatalf("life %d: OpenLock: %v", life, err)
		}
		for i := 0; i < 50; i++ {
			if err := ol.Lock(bound); err != nil {
				t.Fatalf("life %d: Lock: %v", life, err)
			}
			if err := ol.Unlock(bound); err != nil {
				t.Fatalf("life %d: Unlock: %v", life, err)
			}
		}
		h, err := n.Map(bound, 1, "table", lite.Read)
		if err != nil {
			t.Fatalf("life %d: Map: %v", life, err)
		}
		got := make([]byte, 5)
		if err := n.Read(bound, h, 0, got); err != nil || !bytes.Equal(got, []byte("lives")) {
			t.Fatalf("life %d: Read %q: %v", life, got, err)
		}
		ol.Close(bound)
		n.Close()
		cancel()
		if err := c.Remove(2, false); err != nil {
			t.Fatal(err)
		}
	}
}
