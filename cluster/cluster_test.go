package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bounded"
)

// TestAddTwice: adding a node whose id already runs is an error, at once,
// and the cluster keeps working (a node can still be added and closed).
func TestAddTwice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := cluster.Config{Nodes: 2, Runtime: core.Config{RCPeers: -1}}
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = bounded.Within(t, 2*time.Second, "adding node 2 again", func() error { return c.Add(ctx, cfg, 2) })
	if !errors.Is(err, cluster.ErrNodeExists) {
		t.Fatalf("add node 2 twice: %v, want ErrNodeExists", err)
	}
	if err := bounded.Within(t, 5*time.Second, "adding node 3", func() error { return c.Add(ctx, cfg, 3) }); err != nil {
		t.Fatal(err)
	}
	if err := bounded.Within(t, 5*time.Second, "removing node 2", func() error { return c.Remove(2, false) }); err != nil {
		t.Fatal(err)
	}
	if err := bounded.Within(t, 5*time.Second, "adding node 2 back", func() error { return c.Add(ctx, cfg, 2) }); err != nil {
		t.Fatal(err)
	}
	if len(c.Runtimes) != 3 {
		t.Errorf("%d runtimes, want 3", len(c.Runtimes))
	}
}

// TestContextHonoured: Start and Add with an ended context fail with its
// error instead of starting anything.
func TestContextHonoured(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	cfg := cluster.Config{Nodes: 2, Runtime: core.Config{RCPeers: -1}}
	if _, err := within2(t, func() (*cluster.Cluster, error) { return cluster.Start(ended, cfg) }); !errors.Is(err, context.Canceled) {
		t.Errorf("Start with a cancelled context: %v, want context.Canceled", err)
	}
	ctx, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := bounded.Within(t, 2*time.Second, "Add with a cancelled context", func() error { return c.Add(ended, cfg, 3) }); !errors.Is(err, context.Canceled) {
		t.Errorf("Add with a cancelled context: %v, want context.Canceled", err)
	}
	if c.Node(3) != nil {
		t.Error("node 3 started with a cancelled context")
	}
}

func within2(t *testing.T, f func() (*cluster.Cluster, error)) (*cluster.Cluster, error) {
	t.Helper()
	var c *cluster.Cluster
	err := bounded.Within(t, 2*time.Second, "Start with a cancelled context", func() error {
		var err error
		c, err = f()
		return err
	})
	return c, err
}
