package lite

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// TestCloseWithoutDirectory: a closing Node withdraws its names without
// waiting for the directory's answers: they disappear from a live
// directory, and a Node whose directory's Node is gone (its port unbound:
// withdrawals are dropped unanswered) still closes promptly, not after a
// control timeout per LMR it lists.
func TestCloseWithoutDirectory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir, err := Open(ctx, core.Embed(c.Node(2)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := Open(ctx, core.Embed(c.Node(1)), Options{Directory: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Malloc(ctx, "x", 64, Read); err != nil {
		t.Fatal(err)
	}
	n.Close()
	for { // the withdrawal is a SEND the directory handles in its own time
		if _, err := dir.Master(ctx, "x"); errors.Is(err, ErrFreed) {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("the name of a closed Node's LMR is still listed: %v", err)
		}
		runtime.Gosched()
	}
	if n, err = Open(ctx, core.Embed(c.Node(1)), Options{Directory: 2}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		if _, err := n.Malloc(ctx, name, 64, Read); err != nil {
			t.Fatal(err)
		}
	}
	dir.Close()
	start := time.Now()
	n.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close with the directory gone took %v", d)
	}
}
