package scale

import (
	"context"
	"io"
	"os"
	"testing"
	"time"
)

// TestSmallRun: the scale run at 150 and 300 nodes, both modes. Every
// connect succeeded (a failure fails the run); a DC node's QPs do not grow
// with N, and an RC-only node has a QP per peer beyond the DC node's.
func TestSmallRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and 100 runtimes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := Config{Sizes: []int{150, 300}, Modes: []string{ModeDC, ModeRC}, Peers: 10, Sample: 16, Join: 40, JoinFull: 8,
		Reads: 200, Workers: 8, Log: io.Discard}
	if testing.Verbose() {
		cfg.Log = os.Stderr
	}
	stages, err := Run(ctx, cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(stages) != 4 {
		t.Fatalf("%d stages, want 4", len(stages))
	}
	byMode := map[string][]Stage{}
	for _, s := range stages {
		byMode[s.Mode] = append(byMode[s.Mode], s)
		if s.Connects != cfg.Sample*cfg.Peers || s.Connect.P50 <= 0 || s.Read.P50 <= 0 || s.Unplaced != 0 {
			t.Errorf("%s", s.Line())
		}
		if s.JoinFull.P50 <= 0 || s.JoinAll <= 0 || s.JoinConnect.P50 <= 0 {
			t.Errorf("storm not measured: %s", s.Line())
		}
	}
	dc, rc := byMode[ModeDC], byMode[ModeRC]
	if dc[0].QPs.Max != dc[1].QPs.Max {
		t.Errorf("DC: QPs per node %v at %d nodes, %v at %d", dc[0].QPs, dc[0].N, dc[1].QPs, dc[1].N)
	}
	if rc[0].QPs.Mean < dc[0].QPs.Mean+float64(cfg.Peers)/2 {
		t.Errorf("RC-only: %v QPs per node, DC %v: want a QP per peer more", rc[0].QPs, dc[0].QPs)
	}
}
