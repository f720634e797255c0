package etcdstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// startRuntime starts node id on a new device of fab, registered in etcd
// with its own MetaServer mirroring it, retrying while etcd has no leader.
func startRuntime(t *testing.T, fab *soft.Fabric, eps []string, id krcore.NodeID) *core.Runtime {
	t.Helper()
	dev, err := fab.NewNode(soft.Config{RetryTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	store := newStore(t, eps)
	ctx := testCtx(t, 20*time.Second)
	for {
		nctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		rt, err := core.New(nctx, core.Config{Device: dev, Node: id, Membership: store, Lease: time.Second})
		cancel()
		if err == nil {
			t.Cleanup(func() { rt.Close() })
			return rt
		}
		if ctx.Err() != nil {
			t.Fatalf("node %d: %v", id, err)
		}
	}
}

// exportRegion exports 64 bytes holding text as "r" on rt.
func exportRegion(t *testing.T, rt *core.Runtime, text string) {
	t.Helper()
	mem, err := rt.RegMR(64, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem.Bytes(), text)
	if err := rt.Export("r", mem, 0, 64, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
}

// reader is a VQ from one runtime to a peer's region "r".
type reader struct {
	q   *core.Queue
	g   krcore.Region
	buf *core.MR
}

// connect builds a reader to node, retrying (a connect a client retries)
// until within passes.
func connect(t *testing.T, rt *core.Runtime, node krcore.NodeID, within time.Duration) *reader {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r, err := tryConnect(rt, node)
		if err == nil {
			t.Cleanup(func() { r.q.Close() })
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect to node %d: %v", node, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tryConnect(rt *core.Runtime, node krcore.NodeID) (*reader, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	q, err := rt.Queue()
	if err != nil {
		return nil, err
	}
	r := &reader{q: q}
	if err = q.Connect(ctx, node, nil); err == nil {
		if r.g, err = q.Region(ctx, "r"); err == nil {
			r.buf, err = rt.RegMR(64, verbs.AccessAll)
		}
	}
	if err != nil {
		q.Close()
		return nil, err
	}
	return r, nil
}

// read READs 8 bytes of the region.
func (r *reader) read() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := r.q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: r.buf.Range(0, 8), Remote: r.g.At(0)}); err != nil {
		return "", err
	}
	out := make([]krcore.Completion, 1)
	if _, err := r.q.PopWait(ctx, out); err != nil {
		return "", err
	}
	return string(r.buf.Bytes()[:8]), out[0].Err()
}

// TestRuntimesOnEtcd: runtimes register in a three-member etcd cluster,
// each with an embedded MetaServer mirroring it. While node 3 READs node
// 2's region through a connected VQ (a cached peer), the etcd leader is
// killed, a node joins and node 3 connects to it, then node 1 (a
// MetaServer) is closed: every READ succeeds throughout.
func TestRuntimesOnEtcd(t *testing.T) {
	ms := startEtcd(t, 3)
	eps := endpoints(ms)
	fab := soft.NewFabric()
	rt1 := startRuntime(t, fab, eps, 1)
	rt2 := startRuntime(t, fab, eps, 2)
	rt3 := startRuntime(t, fab, eps, 3)
	exportRegion(t, rt2, "node2---")
	cached := connect(t, rt3, 2, 5*time.Second)

	var reads, failed atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			reads.Add(1)
			if got, err := cached.read(); err != nil || got != "node2---" {
				failed.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	killed := time.Now()
	leaderOf(ms).kill()
	rt4 := startRuntime(t, fab, eps, 4)
	exportRegion(t, rt4, "node4---")
	if got, err := connect(t, rt3, 4, 10*time.Second).read(); err != nil || got != "node4---" {
		t.Fatalf("READ of a node that joined after the leader died: %q %v", got, err)
	}
	t.Logf("a node started as the etcd leader died was connected to %v after the kill", time.Since(killed).Round(time.Millisecond))
	rt1.Close()
	time.Sleep(200 * time.Millisecond)
	close(stop)
	<-done
	t.Logf("%d READs to a cached peer, %d failed", reads.Load(), failed.Load())
	if failed.Load() != 0 || reads.Load() < 10 {
		t.Fatalf("%d of %d READs to a cached peer failed", failed.Load(), reads.Load())
	}
	if src := rt3.MetaSource(); src != "etcd "+eps[0]+","+eps[1]+","+eps[2]+" /test/" {
		t.Fatalf("MetaSource %q", src)
	}
}
