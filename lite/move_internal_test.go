package lite

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// TestMoveBack: a Move whose context ends while it copies, after it
// withdrew the grants on the old copy, grants the old copy again under a
// new generation: the LMR stays where it was, whole, and a handle mapped
// before reads it (after learning the new generation).
func TestMoveBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var nodes [4]*Node
	for i := 3; i >= 1; i-- { // node 1, the master, closes first
		if nodes[i], err = Open(ctx, core.Embed(c.Node(uint64(i))), Options{}); err != nil {
			t.Fatal(err)
		}
		defer nodes[i].Close()
	}
	const size = 16 << 20 // a copy of many chunks
	l, err := nodes[1].Malloc(ctx, "big", size, Read|Write)
	if err != nil {
		t.Fatal(err)
	}
	want := l.Bytes()
	for i := range want {
		want[i] = byte(i / 4093)
	}
	want = bytes.Clone(want)
	h, err := nodes[2].Map(ctx, 1, "big", Read)
	if err != nil {
		t.Fatal(err)
	}
	backs := 0
	for d := 2 * time.Millisecond; d < 2*time.Second && backs == 0; d *= 2 {
		gen := l.gen()
		mctx, mcancel := context.WithTimeout(ctx, d)
		err := l.Move(mctx, 3)
		mcancel()
		if err == nil {
			t.Skipf("a Move of %d bytes took less than %v: nothing to cut", size, d)
		}
		n := l.Nodes()
		if len(n) != 1 || n[0] != 1 {
			t.Fatalf("after a failed Move (%v) the LMR is on %v", err, n)
		}
		if l.gen() != gen {
			backs++
			t.Logf("cut after %v while copying: %v", d, err)
		}
		got := make([]byte, 64<<10)
		for _, off := range []int{0, size / 2, size - len(got)} {
			if err := nodes[2].Read(ctx, h, off, got); err != nil || !bytes.Equal(got, want[off:off+len(got)]) {
				t.Fatalf("Read at %d after a failed Move: %v, equal %v", off, err, bytes.Equal(got, want[off:off+len(got)]))
			}
		}
		if !bytes.Equal(l.Bytes(), want) {
			t.Fatal("a failed Move changed the LMR")
		}
	}
	if backs == 0 {
		t.Fatal("no Move was cut after withdrawing the grants")
	}
	nodes[3].mu.Lock()
	left := len(nodes[3].pieces)
	nodes[3].mu.Unlock()
	if left != 0 {
		t.Fatalf("node 3 still holds %d pieces of failed moves", left)
	}
}

func (l *LMR) gen() uint32 {
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	return l.lay.gen
}
