package main

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/liteapp"
)

func TestMain(m *testing.M) {
	liteapp.RunWorker("serverless", function) // a function process a test started
	os.Exit(m.Run())
}

// TestChain: one invocation of the chain per mode, at 1 KiB and at 1 MiB
// of state. Every consumer checked the state it took (a wrong byte fails
// its process, and so the run), and every phase of the breakdown was seen.
func TestChain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := config{sizes: []int{1 << 10, 1 << 20}, runs: 1, modes: allModes}
	results, err := run(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// With -fnprocs 1 (each function process checks it ran so).
	one := config{sizes: []int{1 << 10}, runs: 1, modes: []string{modeDaemon}, fnprocs: 1}
	if _, err := run(ctx, one, io.Discard); err != nil {
		t.Fatalf("-fnprocs 1: %v", err)
	}
	if len(results) != len(cfg.sizes)*len(cfg.modes) {
		t.Fatalf("%d results, want %d", len(results), len(cfg.sizes)*len(cfg.modes))
	}
	for _, res := range results {
		v := res.median()
		if v.start <= 0 || v.connect <= 0 || v.transfer <= 0 || v.e2e < v.start+v.connect+v.transfer {
			t.Errorf("%s %d B: e2e %v, start %v, connect %v, transfer %v", res.mode, res.size, v.e2e, v.start, v.connect, v.transfer)
		}
		if (res.mode == modeTCP) != (v.register == 0) {
			t.Errorf("%s %d B: register %v (only tcp registers no memory)", res.mode, res.size, v.register)
		}
	}
}

// TestCheck: check refuses state with one byte wrong.
func TestCheck(t *testing.T) {
	b := make([]byte, 4096)
	fill(b, 7)
	if err := check(b, 7); err != nil {
		t.Fatal(err)
	}
	b[4000] ^= 1
	if check(b, 7) == nil {
		t.Fatal("check passed a flipped byte")
	}
	if check(b[:100], 8) == nil {
		t.Fatal("check passed another invocation's state")
	}
}

// TestParseConfig: bad command lines are refused.
func TestParseConfig(t *testing.T) {
	for _, c := range []struct {
		sizes, modes  string
		runs, fnprocs int
	}{{"0", "tcp", 1, 0}, {"x", "tcp", 1, 0}, {"1024", "udp", 1, 0}, {"1024", "tcp", 0, 0}, {"1024", "tcp", 1, -1}} {
		if _, err := parseConfig(c.sizes, c.runs, c.modes, c.fnprocs); err == nil {
			t.Errorf("-sizes %q -modes %q -runs %d -fnprocs %d: accepted", c.sizes, c.modes, c.runs, c.fnprocs)
		}
	}
}
