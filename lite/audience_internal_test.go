package lite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// TestLoanOnlyForLender: the holder of a Memcpy's dst READs src only
// through a loan of the caller's own: another Node with a Write grant at
// the holder (node 3's, src's master) that names the mapper's loan, or a
// grant the holder's Node mapped itself, as src is refused (ErrPerm), and
// dst is left alone.
func TestLoanOnlyForLender(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() }) // after the Nodes' Close
	open := func(node uint64) *Node {
		n, err := Open(ctx, core.Embed(c.Node(node)), Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	mapper, holder, far := open(1), open(2), open(3)
	thief := far
	dst, err := holder.Malloc(ctx, "dst", 4096, Read|Write)
	if err != nil {
		t.Fatal(err)
	}
	src, err := far.Malloc(ctx, "src", 4096, Read)
	if err != nil {
		t.Fatal(err)
	}
	copy(src.Bytes(), "secret of node 3")
	mapOf := func(n *Node, master uint64, name string, p Perm) (Handle, *mapping) {
		h, err := n.Map(ctx, master, name, p)
		if err != nil {
			t.Fatal(err)
		}
		m, err := n.lookup(h)
		if err != nil {
			t.Fatal(err)
		}
		return h, m
	}
	hd, _ := mapOf(mapper, 2, "dst", Write)
	hs, ms := mapOf(mapper, 3, "src", Read)
	if err := mapper.Memcpy(ctx, hd, 0, hs, 0, 16); err != nil {
		t.Fatal(err)
	}
	mapper.mu.Lock()
	loanExp := mapper.loans[loan{master: 3, grant: ms.export, holder: 2}]
	mapper.mu.Unlock()
	if loanExp == "" {
		t.Fatal("no loan kept after a Memcpy from node 3 to node 2")
	}
	_, own := mapOf(holder, 3, "src", Read) // the holder's Node's own grant on src
	clear(dst.Bytes())
	_, td := mapOf(thief, 2, "dst", Write)
	for what, name := range map[string]string{"the mapper's loan": exportName(loanExp, ms.lay.gen), "the holder's own grant": own.regions[0].Name()} {
		a := memArgs{n: 16, srcNode: 3, dst: td.regions[0].Name(), src: name}
		if err := thief.memop(ctx, opMemcpy, 2, a); !errors.Is(err, ErrPerm) {
			t.Errorf("a Memcpy naming %s as src: %v, want ErrPerm", what, err)
		}
	}
	if dst.Bytes()[0] != 0 {
		t.Fatal("a refused Memcpy wrote dst")
	}
}
