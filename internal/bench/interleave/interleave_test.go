package interleave

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/perf"
)

// record returns block functions that append their letter to *order.
func record(order *strings.Builder, letters string) []func() error {
	var fs []func() error
	for _, l := range letters {
		fs = append(fs, func() error { order.WriteRune(l); return nil })
	}
	return fs
}

// TestPairOrder: two series run Blocks blocks each in ABBA order, so
// neither always goes first.
func TestPairOrder(t *testing.T) {
	var order strings.Builder
	fs := record(&order, "AB")
	if err := Pair(fs[0], fs[1]); err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat("ABBA", Blocks/2); order.String() != want {
		t.Errorf("order %s, want %s", order.String(), want)
	}
}

// TestRotateOrder: three series rotate and reverse from block to block,
// each running Blocks blocks and first in more than one round.
func TestRotateOrder(t *testing.T) {
	var order strings.Builder
	if err := Rotate(record(&order, "ABC")...); err != nil {
		t.Fatal(err)
	}
	got := order.String()
	if !strings.HasPrefix(got, "ABC"+"CBA"+"BCA"+"ACB") {
		t.Errorf("order %s, want it to start ABC CBA BCA ACB", got)
	}
	firsts := map[byte]bool{}
	for i := 0; i < len(got); i += 3 {
		firsts[got[i]] = true
	}
	for _, l := range "ABC" {
		if n := strings.Count(got, string(l)); n != Blocks {
			t.Errorf("%c ran %d blocks, want %d", l, n, Blocks)
		}
	}
	if len(firsts) != 3 {
		t.Errorf("order %s: only %d series ever go first", got, len(firsts))
	}
}

// TestPairStopsAtError: the first failing block ends the comparison with
// its error; no block runs after it.
func TestPairStopsAtError(t *testing.T) {
	boom := errors.New("boom")
	runs := 0
	a := func() error { runs++; return nil }
	b := func() error { runs++; return boom }
	if err := Pair(a, b); !errors.Is(err, boom) || runs != 2 {
		t.Errorf("err %v after %d blocks, want boom after 2", err, runs)
	}
}

// TestLatencyGathers: warm-up operations are untimed and each block's
// samples are kept in order.
func TestLatencyGathers(t *testing.T) {
	var calls [][2]int
	s := &Latency{Run: func(warmup, iters int) ([]time.Duration, error) {
		calls = append(calls, [2]int{warmup, iters})
		out := make([]time.Duration, iters)
		for i := range out {
			out[i] = time.Duration(len(calls))
		}
		return out, nil
	}}
	if err := WarmLatency(5, s); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Block(3)(); err != nil {
			t.Fatal(err)
		}
	}
	if want := [][2]int{{5, 0}, {0, 3}, {0, 3}}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	if want := []time.Duration{2, 2, 2, 3, 3, 3}; !slices.Equal(s.Samples, want) {
		t.Errorf("samples %v, want %v", s.Samples, want)
	}
}

// TestBandwidthJoins: a series' blocks are laid end to end on its own
// clock (the time between them, when the other series ran, is not its),
// and each block's marks are kept for the median block.
func TestBandwidthJoins(t *testing.T) {
	block := []perf.Mark{{At: 0, Msgs: 0}, {At: 4, Msgs: 2}, {At: 10, Msgs: 5}}
	s := NewBandwidth(func(total int) ([]perf.Mark, error) { return block, nil })
	for range 2 {
		if err := s.Block(5)(); err != nil {
			t.Fatal(err)
		}
	}
	want := []perf.Mark{{}, {At: 4, Msgs: 2}, {At: 10, Msgs: 5}, {At: 14, Msgs: 7}, {At: 20, Msgs: 10}}
	if !slices.Equal(s.Marks, want) {
		t.Errorf("marks %v, want %v", s.Marks, want)
	}
	if len(s.BlockMarks) != 2 {
		t.Errorf("%d blocks kept, want 2", len(s.BlockMarks))
	}
	if PerBlock(5) != 1 || PerBlock(100) != 100/Blocks {
		t.Errorf("PerBlock(5) = %d, PerBlock(100) = %d", PerBlock(5), PerBlock(100))
	}
}
