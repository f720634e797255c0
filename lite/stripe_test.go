package lite_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/verbs"
)

// TestStriped: an LMR striped over three nodes (one of them the mapper's,
// embedded or through krcored), larger than any node's piece, is written
// and read whole through a handle, each request going to the node holding
// its stripe, which enforces the grant's rights; Free withdraws it
// everywhere.
func TestStriped(t *testing.T) {
	others, mappers := testcluster.APIs(t, 3)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			mapper := open(t, api)
			master := open(t, others[0])
			open(t, others[1])        // node 3, a holder
			const size = 3<<16 + 1000 // pieces of ~64 KiB each
			l, err := master.MallocOn(ctx, "striped", size, lite.Read|lite.Write,
				lite.Placement{Nodes: []krcore.NodeID{3, 2, 1}, Stripe: 4096})
			if err != nil {
				t.Fatal(err)
			}
			if l.Bytes() != nil {
				t.Fatal("Bytes of a striped LMR")
			}
			rw, err := mapper.Map(ctx, 2, "striped", lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]byte, size)
			for i := range want {
				want[i] = byte(i * 7 / 4096)
			}
			if err := mapper.Write(ctx, rw, 0, want); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if err := mapper.Read(ctx, rw, 0, got); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("Read: %v, equal %v", err, bytes.Equal(got, want))
			}
			// An unaligned range across several stripes.
			part := make([]byte, 3*4096)
			if err := mapper.Read(ctx, rw, 4000, part); err != nil || !bytes.Equal(part, want[4000:4000+len(part)]) {
				t.Fatalf("Read across stripes: %v", err)
			}
			ro, err := mapper.Map(ctx, 2, "striped", lite.Read)
			if err != nil {
				t.Fatal(err)
			}
			// Stripes 3, 4 and 5 live on nodes 3, 2 and 1: each refuses.
			for _, off := range []int{3 * 4096, 4 * 4096, 5 * 4096} {
				if err := mapper.Write(ctx, ro, off, []byte("evil")); !errors.Is(err, verbs.RemAccessErr) {
					t.Fatalf("Write at %d through a read handle: %v, want REM_ACCESS_ERR", off, err)
				}
			}
			if err := mapper.Read(ctx, rw, size-4, got[:8]); !errors.Is(err, krcore.ErrInvalid) {
				t.Fatalf("Read past the end: %v, want ErrInvalid", err)
			}
			if err := l.Free(); err != nil {
				t.Fatal(err)
			}
			if err := mapper.Read(ctx, rw, 4*4096, got[:8]); !errors.Is(err, verbs.RemAccessErr) || !errors.Is(err, lite.ErrFreed) {
				t.Fatalf("Read after Free: %v, want REM_ACCESS_ERR and ErrFreed", err)
			}
		})
	}
}

// TestPlacementInvalid: placements that cannot hold the LMR are refused.
func TestPlacementInvalid(t *testing.T) {
	masterAPI, _ := apis(t)
	ctx := ctxT(t)
	master := open(t, masterAPI)
	for _, p := range []lite.Placement{
		{Nodes: []krcore.NodeID{1, 1}},
		{Nodes: []krcore.NodeID{0}},
		{Nodes: []krcore.NodeID{1, 2}, Stripe: 12},
		{Nodes: []krcore.NodeID{1, 2}, Stripe: 1 << 20}, // node 2 gets no stripe
		{Stripe: -8},
	} {
		if _, err := master.MallocOn(ctx, "x", 4096, lite.Read, p); !errors.Is(err, krcore.ErrInvalid) {
			t.Fatalf("MallocOn %+v: %v, want ErrInvalid", p, err)
		}
	}
	// A holder that is not there fails the Malloc, and the name is free again.
	if _, err := master.MallocOn(ctx, "x", 4096, lite.Read, lite.Placement{Nodes: []krcore.NodeID{2, 9}}); err == nil {
		t.Fatal("MallocOn a node that does not exist")
	}
	if _, err := master.Malloc(ctx, "x", 4096, lite.Read); err != nil {
		t.Fatal(err)
	}
}

// Node 1 mallocs a 1 MiB LMR striped over nodes 2 and 3 in stripes of 4
// KiB, and maps it: a Write across a stripe boundary goes half to each
// node, and the Read comes back whole.
func ExampleNode_MallocOn() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 3})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	var master *lite.Node
	for id := krcore.NodeID(3); id >= 1; id-- { // the master, opened last, closes first
		n, err := lite.Open(ctx, core.Embed(c.Node(id)), lite.Options{})
		if err != nil {
			panic(err)
		}
		defer n.Close()
		master = n
	}

	l, err := master.MallocOn(ctx, "big", 1<<20, lite.Read|lite.Write,
		lite.Placement{Nodes: []krcore.NodeID{2, 3}, Stripe: 4096})
	fmt.Println(l.Nodes(), err)

	h, _ := master.Map(ctx, 1, "big", lite.Read|lite.Write)
	err = master.Write(ctx, h, 4088, []byte("across two nodes"))
	buf := make([]byte, 16)
	err = errors.Join(err, master.Read(ctx, h, 4088, buf))
	fmt.Println(string(buf), err)
	// Output:
	// [2 3] <nil>
	// across two nodes <nil>
}

// BenchmarkRead8: an 8-byte Read through a handle on an LMR held by its
// master (node 2) alone, and on one striped over nodes 2 and 3 (the word
// read lies on node 3: a striped Read costs one request too), the mapper
// (node 1) embedded and through krcored.
func BenchmarkRead8(b *testing.B) {
	others, mappers := testcluster.APIs(b, 3)
	ctx := context.Background()
	open(b, others[1])
	master := open(b, others[0])
	if _, err := master.Malloc(ctx, "single", 1<<20, lite.Read); err != nil {
		b.Fatal(err)
	}
	p := lite.Placement{Nodes: []krcore.NodeID{2, 3}, Stripe: 4096}
	if _, err := master.MallocOn(ctx, "striped", 1<<20, lite.Read, p); err != nil {
		b.Fatal(err)
	}
	for _, api := range []string{"embedded", "daemon"} {
		n, err := lite.Open(ctx, mappers[api], lite.Options{}) // one at a time: node 1's port
		if err != nil {
			b.Fatal(err)
		}
		for _, lmr := range []string{"single", "striped"} {
			b.Run(api+"/"+lmr, func(b *testing.B) {
				h, err := n.Map(ctx, 2, lmr, lite.Read)
				if err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, 8)
				for b.Loop() {
					if err := n.Read(ctx, h, 4096+64, buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		n.Close()
	}
}
