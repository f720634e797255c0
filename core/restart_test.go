package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestStaleTargetRefetched: a node restarts under the same id with a new DC
// target; a peer's cached target is stale, the first request to it fails at
// the wire, and the runtime refetches the record and reposts instead of
// failing the request.
func TestStaleTargetRefetched(t *testing.T) {
	cfg := cluster.Config{Nodes: 2, Runtime: core.Config{RCPeers: -1, Path: verbs.Path{Timeout: 50 * time.Millisecond, RetryCount: 3}},
		Soft: soft.Config{RetryTimeout: 300 * time.Millisecond}}
	c, err := cluster.Start(ctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a := c.Node(1)
	serve(t, c.Node(2), "r", 64)
	if _, err := a.Region(ctx(t), 2, "r"); err != nil {
		t.Fatal(err)
	}
	// Restart node 2: same id and fabric address, new DCT and key.
	c.Runtimes[1].Close()
	c.Devices[1].Close()
	c.Runtimes, c.Devices = c.Runtimes[:1], c.Devices[:1]
	if err := c.Add(ctx(t), cfg, 2); err != nil {
		t.Fatal(err)
	}
	serve(t, c.Node(2), "r", 64)
	g, err := a.Region(ctx(t), 2, "r")
	if err != nil {
		t.Fatalf("region lookup after restart: %v", err)
	}
	if a.Stats().StaleTargets == 0 {
		t.Error("no stale target counted")
	}
	q := mustQueue(t, a, 2)
	local, _ := a.RegMR(8, verbs.AccessAll)
	q.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(0)})
	if wc := pop1(t, q); wc.Status != verbs.Success {
		t.Fatalf("READ after restart: %+v", wc)
	}
}

// TestLeaseExpiry: a node that dies without deregistering disappears from
// the MetaServer when its lease lapses; a cold connect then fails cleanly.
func TestLeaseExpiry(t *testing.T) {
	c := start(t, 3, core.Config{RCPeers: -1, Lease: 300 * time.Millisecond})
	a := c.Node(1)
	if err := mustQueue(t, a, 3).Connect(ctx(t), 3, nil); err != nil {
		t.Fatal(err)
	}
	c.Devices[2].Close() // node 3's NIC dies: no deregistration, no renewals
	deadline := time.Now().Add(5 * time.Second)
	for {
		a.Forget(ctx(t), 3)
		q, _ := a.Queue()
		err := q.Connect(ctx(t), 3, nil)
		q.Close()
		if errors.Is(err, krcore.ErrUnreachable) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 3 still registered 5s after its 300ms lease lapsed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClosedRuntime: calls on a closed runtime fail with ErrClosed, never
// hang.
func TestClosedRuntime(t *testing.T) {
	c := start(t, 2, core.Config{RCPeers: -1})
	b := c.Node(2)
	q := mustQueue(t, b, 1)
	c.Runtimes[1].Close()
	if _, err := b.Queue(); !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("Queue after Close: %v", err)
	}
	if _, err := q.Push(context.Background(), false, krcore.Request{Op: verbs.OpRead}); !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("Push after Close: %v", err)
	}
	if err := q.Connect(ctx(t), 1, nil); !errors.Is(err, krcore.ErrClosed) {
		t.Errorf("Connect after Close: %v", err)
	}
}
