package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// TestMembershipCluster: runtimes register in a Membership instead of with
// the MetaServer, which mirrors it; a node READs another's region through
// a VQ, and a node that leaves is withdrawn from the table.
func TestMembershipCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := meta.NewMemMembership()
	cfg := cluster.Config{Nodes: 3, Runtime: core.Config{Membership: m}}
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, a := c.Node(2), c.Node(3)
	mem, err := b.RegMR(64, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem.Bytes(), "mirrored")
	if err := b.Export("r", mem, 0, 64, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	q, err := a.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Connect(ctx, 2, nil); err != nil {
		t.Fatal(err)
	}
	g, err := q.Region(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := a.RegMR(64, verbs.AccessAll)
	if _, err := q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)}); err != nil {
		t.Fatal(err)
	}
	out := make([]krcore.Completion, 1)
	if _, err := q.PopWait(ctx, out); err != nil || out[0].Err() != nil || string(buf.Bytes()[:8]) != "mirrored" {
		t.Fatalf("READ through a mirrored record: %v %+v %q", err, out[0], buf.Bytes()[:8])
	}
	if err := c.Remove(2, false); err != nil {
		t.Fatal(err)
	}
	infos, _ := m.Servers(ctx)
	if len(infos) != 1 || infos[0] != c.Node(1).MetaInfo() {
		t.Fatalf("announced %v, want node 1's MetaServer", infos)
	}
	mc, err := meta.NewClient(c.Devices[0], infos, meta.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := mc.Fetch(ctx, 2); errors.Is(err, meta.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node 2 still served 5s after it left")
		}
	}
}
