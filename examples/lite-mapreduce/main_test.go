package main

import (
	"context"
	"io"
	"maps"
	"os"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/liteapp"
)

func TestMain(m *testing.M) {
	liteapp.RunWorker("lite-mapreduce", worker) // a worker process a test started
	os.Exit(m.Run())
}

// TestWordCount runs the job small over 3 worker processes, through lite
// and through net/rpc, and checks both against a direct count.
func TestWordCount(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := config{workers: 3, words: 30000, vocab: 2000, seed: 7, rounds: 1, impls: []string{"lite", "rpc"}}
	results, err := run(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := count(generate(cfg.seed, cfg.words, cfg.vocab))
	if len(results) != 2 {
		t.Fatalf("%d results, want 2", len(results))
	}
	for _, r := range results {
		if !maps.Equal(r.counts, want) || r.took <= 0 {
			t.Errorf("%s: %d words counted in %v, want %d", r.impl, len(r.counts), r.took, len(want))
		}
	}
}

// TestSplit: the pieces cover the text, cut only between words.
func TestSplit(t *testing.T) {
	text := generate(3, 1000, 50)
	for n := 1; n <= 7; n++ {
		var all []byte
		for _, p := range split(text, n) {
			all = append(all, p...)
		}
		if string(all) != string(text) {
			t.Fatalf("split in %d does not cover the text", n)
		}
		got := counts{}
		for _, p := range split(text, n) {
			got.add(count(p))
		}
		if !maps.Equal(got, count(text)) {
			t.Fatalf("split in %d cut a word", n)
		}
	}
}
