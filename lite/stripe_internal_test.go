package lite

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// TestExtents: an operation is cut at stripe boundaries and at the
// largest request, and each extent names the node holding it and the
// offset in that node's piece (stripes dealt round-robin).
func TestExtents(t *testing.T) {
	l := layout{size: 100, stripe: 16, nodes: []uint64{7, 8, 9}}
	got := l.extents(10, 40, 12)
	want := []extent{
		{node: 0, remote: 10, at: 0, n: 6},  // stripe 0 on node 7
		{node: 1, remote: 0, at: 6, n: 12},  // stripe 1 on node 8, cut at 12
		{node: 1, remote: 12, at: 18, n: 4}, // its rest
		{node: 2, remote: 0, at: 22, n: 12}, // stripe 2 on node 9
		{node: 2, remote: 12, at: 34, n: 4},
		{node: 0, remote: 16, at: 38, n: 2}, // stripe 3: node 7's second
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("extents:\n got %+v\nwant %+v", got, want)
	}
	one := single(7, 100)
	if got := one.extents(0, 100, 64); !reflect.DeepEqual(got, []extent{{0, 0, 0, 64}, {0, 64, 64, 36}}) {
		t.Fatalf("single-node extents: %+v", got)
	}
	for _, c := range [][2]int{{-1, 1}, {0, 101}, {100, 1}, {1, -1}} {
		if l.fits(c[0], c[1]) == nil {
			t.Fatalf("%d bytes at %d fit a 100-byte LMR", c[1], c[0])
		}
	}
}

// TestStripedPaging: an LMR striped over more nodes than a Map's reply
// can name is mapped by fetching its layout in pages, used whole, and Free
// releases every node's piece.
func TestStripedPaging(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const k = 26
	c, err := cluster.Start(ctx, cluster.Config{Nodes: k})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nodes := make([]*Node, k+1)
	var ids []krcore.NodeID
	for i := 1; i <= k; i++ {
		if nodes[i], err = Open(ctx, core.Embed(c.Node(krcore.NodeID(i))), Options{}); err != nil {
			t.Fatal(err)
		}
		defer nodes[i].Close()
		ids = append(ids, krcore.NodeID(i))
	}
	name := strings.Repeat("n", maxName)
	if fit := (slotSize - hdrLen - len(grantName()) - layoutHdr) / 8; fit >= k {
		t.Fatalf("a Map reply names %d nodes: no paging to test", fit)
	}
	const size = k*8*3 + 5
	l, err := nodes[1].MallocOn(ctx, name, size, Read|Write, Placement{Nodes: ids, Stripe: 8})
	if err != nil {
		t.Fatal(err)
	}
	h, err := nodes[2].Map(ctx, 1, name, Read|Write)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := nodes[2].lookup(h)
	if !reflect.DeepEqual(m.lay.nodes, ids) {
		t.Fatalf("mapped layout over %v, want %v", m.lay.nodes, ids)
	}
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i)
	}
	got := make([]byte, size)
	if err := nodes[2].Write(ctx, h, 0, want); err != nil {
		t.Fatal(err)
	}
	if err := nodes[2].Read(ctx, h, 0, got); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Read: %v", err)
	}
	for i := 1; i <= k; i++ {
		if len(nodes[i].pieces) != 1 {
			t.Fatalf("node %d holds %d pieces, want 1", i, len(nodes[i].pieces))
		}
	}
	if err := l.Free(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= k; i++ {
		if len(nodes[i].pieces) != 0 {
			t.Fatalf("node %d holds %d pieces after Free", i, len(nodes[i].pieces))
		}
	}
}
