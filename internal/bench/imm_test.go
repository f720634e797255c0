package bench

import (
	"context"
	"encoding/json"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/perf"
)

// TestInprocImm: krbench -inproc imm prints one table per size with the
// four series (raw QP and VQ, SEND and WRITE_WITH_IMM round trips), each
// of -n round trips; all does not run it.
func TestInprocImm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, stderr := runKrbench(t, ctx, "-inproc", "-json", "-n", "10", "imm")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep perf.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	var sizes []int
	for _, r := range rep.Results {
		if r.Test != testImm {
			t.Errorf("ran %s, asked for imm only", r.Test)
			continue
		}
		for _, l := range []string{seriesQPSend, seriesQPImm, seriesVQSend, seriesVQImm} {
			if row := r.LabelRow(l); row == nil || row.Iterations != 10 || row.Typical <= 0 {
				t.Errorf("%s: row %s: %+v", r.Title, l, row)
			}
		}
		sizes = append(sizes, r.Latency[0].Bytes)
	}
	if !slices.Equal(sizes, immSizes) {
		t.Errorf("sizes %v, want %v", sizes, immSizes)
	}
	cfg, err := parseArgs([]string{"-inproc", "all"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(cfg.tests, testImm) {
		t.Errorf("all runs imm: %v", cfg.tests)
	}
}
