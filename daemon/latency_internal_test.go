package daemon

import (
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestLatencyBuckets: a duration lands in the first bucket whose bound is
// at or above it, one beyond the last bound only in the count, and the
// sum is the durations' in seconds.
func TestLatencyBuckets(t *testing.T) {
	var l latency
	for _, ns := range []int64{-5, 0, 1, 1024, 1025, 2048, 1 << 33, 1<<33 + 1} {
		l.observe(ns)
	}
	var sum latencySum
	sum.add(&l)
	var m dto.Metric
	if err := sum.metric(prometheus.NewDesc("x", "x", nil, nil)).Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	bounds := latencyBounds()
	want := map[float64]uint64{bounds[0]: 4, bounds[1]: 6, bounds[2]: 6, bounds[latencyBuckets-2]: 6, bounds[latencyBuckets-1]: 7}
	if len(h.Bucket) != latencyBuckets || bounds[0] != 1.024e-6 || bounds[latencyBuckets-1] < 5 {
		t.Fatalf("%d buckets from %g to %g s: want %d, from 1.024us past the 5 s call timeout", len(h.Bucket), bounds[0], bounds[latencyBuckets-1], latencyBuckets)
	}
	for _, b := range h.Bucket {
		if w, ok := want[b.GetUpperBound()]; ok && b.GetCumulativeCount() != w {
			t.Errorf("le %g: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), w)
		}
	}
	if wantSum := float64(1+1+1+1024+1025+2048+1<<33+1<<33+1) / 1e9; h.GetSampleCount() != 8 || h.GetSampleSum() != wantSum {
		t.Errorf("count %d sum %g, want 8 and %g", h.GetSampleCount(), h.GetSampleSum(), wantSum)
	}
}

// TestReqClass: the labels of a request's class.
func TestReqClass(t *testing.T) {
	for _, c := range []struct {
		op       verbs.Opcode
		n        int
		op2, siz string
	}{
		{verbs.OpRead, 8, "read", "<=64B"}, {verbs.OpRead, 64, "read", "<=64B"}, {verbs.OpWrite, 65, "write", "<=4KiB"},
		{verbs.OpSendImm, 4096, "send_imm", "<=4KiB"}, {verbs.OpFetchAdd, 8, "faa", "<=64B"}, {verbs.OpWriteImm, 1 << 20, "write_imm", ">4KiB"},
		{verbs.Opcode(99), -1, "other", "<=64B"}, {0, 5000, "other", ">4KiB"},
	} {
		i := reqClass(c.op, c.n)
		if int(i) >= reqClasses {
			t.Fatalf("%v %d: class %d of %d", c.op, c.n, i, reqClasses)
		}
		if op, size := classLabels(int(i)); op != c.op2 || size != c.siz {
			t.Errorf("%v %d B: %s %s, want %s %s", c.op, c.n, op, size, c.op2, c.siz)
		}
	}
}

// BenchmarkObserve is what the pump pays per completion to count its
// request's time (latency.observe), beside a Prometheus histogram's
// Observe over the same buckets, and per round for the clock
// (Server.clock, see pump.roundClock).
func BenchmarkObserve(b *testing.B) {
	b.Run("clock", func(b *testing.B) {
		s := &Server{start: time.Now()}
		var t int64
		for b.Loop() {
			t += s.clock()
		}
	})
	b.Run("latency", func(b *testing.B) {
		var l latency
		for i := 0; b.Loop(); i++ {
			l.observe(int64(i&0xfffff) << 4)
		}
	})
	b.Run("prometheus", func(b *testing.B) {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x", Buckets: latencyBounds()})
		for i := 0; b.Loop(); i++ {
			h.Observe(float64(int64(i&0xfffff)<<4) / 1e9)
		}
	})
}
