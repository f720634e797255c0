package lite

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// TestForgedMemop: the holder acts only through the grant a request names
// and only for its mapper: a Memset naming another node's grant, or one
// claiming Write in the message for a read-only grant, changes nothing.
func TestForgedMemop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var nodes [4]*Node
	for i := range 3 {
		if nodes[i+1], err = Open(ctx, core.Embed(c.Node(uint64(i+1))), Options{}); err != nil {
			t.Fatal(err)
		}
		defer nodes[i+1].Close()
	}
	l, err := nodes[2].Malloc(ctx, "victim", 64, Read|Write)
	if err != nil {
		t.Fatal(err)
	}
	exportOf := func(n *Node, perm Perm) string {
		h, err := n.Map(ctx, 2, "victim", perm)
		if err != nil {
			t.Fatal(err)
		}
		m, err := n.lookup(h)
		if err != nil {
			t.Fatal(err)
		}
		return m.regions[0].Name()
	}
	rw1, ro3 := exportOf(nodes[1], Read|Write), exportOf(nodes[3], Read)
	for _, c := range []struct {
		what string
		exp  string
	}{{"node 1's grant, sent by node 3", rw1}, {"node 3's read grant, claiming Write", ro3}} {
		body := memArgs{n: 8, value: 0xff, budget: time.Second, dst: c.exp}.encode()
		r, err := nodes[3].request(ctx, 2, ctlMsg{kind: opMemset, perm: Read | Write | Admin, name: string(body)})
		if err != nil {
			t.Fatal(err)
		}
		if r.code != codePerm {
			t.Fatalf("Memset through %s: code %#x (%s), want codePerm", c.what, r.code, r.name)
		}
		if l.Bytes()[0] != 0 {
			t.Fatalf("Memset through %s changed the LMR", c.what)
		}
	}
}
