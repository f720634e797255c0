package lite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// TestFreeWithdrawsGrants: after Unmap the master no longer exports that
// grant, and after Free no grant of the LMR (a lookup of the export name
// finds nothing). The Free half also holds without Free's own Unexports,
// since core withdraws an MR's exports at Deregister; the Unmap half fails
// without revoke's Unexport.
func TestFreeWithdrawsGrants(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mapperAPI := core.Embed(c.Node(1))
	master, err := Open(ctx, core.Embed(c.Node(2)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	mapper, err := Open(ctx, mapperAPI, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mapper.Close()
	l, err := master.Malloc(ctx, "t", 64, Read)
	if err != nil {
		t.Fatal(err)
	}
	exportOf := func(h Handle) string {
		m, err := mapper.lookup(h)
		if err != nil {
			t.Fatal(err)
		}
		return m.regions[0].Name()
	}
	h1, _ := mapper.Map(ctx, 2, "t", Read)
	h2, err := mapper.Map(ctx, 2, "t", Read)
	if err != nil {
		t.Fatal(err)
	}
	e1, e2 := exportOf(h1), exportOf(h2)
	if _, err := mapper.region(ctx, 2, e1); err != nil {
		t.Fatalf("grant before Unmap, asked as the mapper: %v", err)
	}
	if err := mapper.Unmap(ctx, h1); err != nil {
		t.Fatal(err)
	}
	if _, err := mapper.region(ctx, 2, e1); !errors.Is(err, krcore.ErrNoRegion) {
		t.Fatalf("grant after Unmap: %v, want ErrNoRegion", err)
	}
	if _, err := mapper.region(ctx, 2, e2); err != nil {
		t.Fatalf("grant before Free, asked as the mapper: %v", err)
	}
	if err := l.Free(); err != nil {
		t.Fatal(err)
	}
	if _, err := mapper.region(ctx, 2, e2); !errors.Is(err, krcore.ErrNoRegion) {
		t.Fatalf("grant after Free: %v, want ErrNoRegion", err)
	}
}
