package main

import (
	"context"
	"io"
	"math"
	"os"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/liteapp"
)

func TestMain(m *testing.M) {
	liteapp.RunWorker("lite-graph", worker) // a worker process a test started
	os.Exit(m.Run())
}

// TestPageRank runs PageRank small over 3 worker processes, through lite
// and through net/rpc, and checks both against a single-process run.
func TestPageRank(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := config{workers: 3, vertices: 3000, edges: 20000, iters: 8, rounds: 1, seed: 5, impls: []string{"lite", "rpc"}}
	med, err := run(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := pagerank(cfg.seed, cfg.vertices, cfg.edges, cfg.iters)
	for _, impl := range cfg.impls {
		if d := maxDiff(med[impl].ranks, want); len(med[impl].ranks) != cfg.vertices || d > tolerance {
			t.Errorf("%s: %d ranks, differing by up to %g", impl, len(med[impl].ranks), d)
		}
	}
}

// TestPageRankSums: the ranks stay a distribution (they sum to 1), and
// the partitions' in-edges together are the whole graph's.
func TestPageRankSums(t *testing.T) {
	r := pagerank(2, 1000, 8000, 10)
	var s float64
	for _, x := range r {
		s += x
	}
	if math.Abs(s-1) > 1e-9 {
		t.Fatalf("ranks sum to %v", s)
	}
	whole := generate(2, 1000, 8000, 0, 1000)
	edges := 0
	for p := 1; p <= 3; p++ {
		lo, hi := partition(1000, 3, p)
		for _, in := range generate(2, 1000, 8000, lo, hi).in {
			edges += len(in)
		}
	}
	total := 0
	for _, in := range whole.in {
		total += len(in)
	}
	if edges != total {
		t.Fatalf("partitions hold %d in-edges, the graph %d", edges, total)
	}
}
