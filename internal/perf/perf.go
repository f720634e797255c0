// Package perf turns benchmark measurements into perftest-shaped figures.
//
// It is the statistics and reporting half of cmd/krbench, kept separate so
// other benchmarks (go test -bench helpers, krctl) print the same tables.
// Latency samples become the columns ib_read_lat prints (t_min, t_max,
// t_typical, t_avg, t_stdev, 99% and 99.9% percentiles, in microseconds);
// bandwidth runs become ib_write_bw's (BW peak and BW average in MB/sec,
// MsgRate in Mpps). Results render as text tables (WriteText) that ParseText
// reads back, or as JSON (WriteJSON).
//
// Usage:
//
//	samples := make([]time.Duration, 0, iters)
//	for range iters {
//		t0 := time.Now()
//		doOneOp()
//		samples = append(samples, time.Since(t0))
//	}
//	lat := perf.Latency(8, samples)
//
//	marks := []perf.Mark{{}} // start: nothing completed at t=0
//	... marks = append(marks, perf.Mark{At: time.Since(start), Msgs: done})
//	bw := perf.Bandwidth(65536, marks, txDepth)
//
//	r := perf.Result{Title: "RDMA_Read Latency Test", Test: "read", Mode: perf.ModeLat, Latency: []perf.LatencyStats{lat}}
//	r.WriteText(os.Stdout)
//
// Units follow perftest: 1 MB is 2^20 bytes, 1 Mpps is 10^6 messages/s.
package perf

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// MB is perftest's megabyte (its default report unit is MiB/s labelled
// MB/sec); keeping it makes figures comparable with ib_*_bw output.
const MB = 1 << 20

// LatencyStats is one row of a latency table. Times are microseconds.
type LatencyStats struct {
	// Label replaces the #bytes column when set (e.g. a connect phase).
	Label      string  `json:"label,omitempty"`
	Bytes      int     `json:"bytes"`
	Iterations int     `json:"iterations"`
	Min        float64 `json:"t_min_usec"`
	Max        float64 `json:"t_max_usec"`
	Typical    float64 `json:"t_typical_usec"`
	Avg        float64 `json:"t_avg_usec"`
	Stdev      float64 `json:"t_stdev_usec"`
	P99        float64 `json:"p99_usec"`
	P999       float64 `json:"p99_9_usec"`
}

// Latency summarises per-operation samples for messages of bytes bytes.
// samples is not modified. t_typical is the median; percentiles use
// perftest's index, sorted[ceil((n-1)*p)], so the 99.9% column of a
// 1000-sample run is the maximum, as in ib_read_lat. The standard deviation
// is the population one. No samples give a row of zeros.
func Latency(bytes int, samples []time.Duration) LatencyStats {
	s := LatencyStats{Bytes: bytes, Iterations: len(samples)}
	n := len(samples)
	if n == 0 {
		return s
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	var sum float64
	for _, d := range sorted {
		sum += usec(d)
	}
	avg := sum / float64(n)
	var sq float64
	for _, d := range sorted {
		dv := usec(d) - avg
		sq += dv * dv
	}
	s.Min = usec(sorted[0])
	s.Max = usec(sorted[n-1])
	s.Typical = median(sorted)
	s.Avg = avg
	s.Stdev = math.Sqrt(sq / float64(n))
	s.P99 = usec(sorted[Percentile(n, 0.99)])
	s.P999 = usec(sorted[Percentile(n, 0.999)])
	return s
}

// Percentile returns the index into n sorted samples that perftest reports
// as the p (0..1) percentile: ceil((n-1)*p), clamped to [0, n-1].
func Percentile(n int, p float64) int {
	if n <= 0 {
		return 0
	}
	// The small epsilon keeps 0.99*(n-1) from rounding up past an exact
	// integer because of binary floating point (0.99*100 = 99.00000000000001).
	i := int(math.Ceil(float64(n-1)*p - 1e-9))
	return min(max(i, 0), n-1)
}

func median(sorted []time.Duration) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return usec(sorted[n/2])
	}
	return (usec(sorted[n/2-1]) + usec(sorted[n/2])) / 2
}

func usec(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Mark is a point of a bandwidth run: by At after the start, Msgs messages
// had completed. A run is described by its marks in time order, starting
// with the zero Mark and ending with the last completion.
type Mark struct {
	At   time.Duration
	Msgs int
}

// BandwidthStats is one row of a bandwidth table.
type BandwidthStats struct {
	// Label replaces the #bytes column when set (e.g. a series name).
	Label      string  `json:"label,omitempty"`
	Bytes      int     `json:"bytes"`
	Iterations int     `json:"iterations"`
	PeakMBps   float64 `json:"bw_peak_mb_per_sec"`
	AvgMBps    float64 `json:"bw_average_mb_per_sec"`
	MsgRate    float64 `json:"msg_rate_mpps"`
	// Seconds is the measured duration, so averages can be recomputed.
	Seconds float64 `json:"seconds"`
}

// Bandwidth summarises a run of messages of bytes bytes described by marks.
//
// BW average and MsgRate cover the whole run (last mark). BW peak is the
// best rate over any stretch between two marks that spans at least minSpan
// messages (and at least 5% of the run), so one lucky completion burst
// cannot inflate it the way a two-mark window would; pass the transmit
// depth as minSpan. With fewer than two marks everything is zero.
func Bandwidth(bytes int, marks []Mark, minSpan int) BandwidthStats {
	s := BandwidthStats{Bytes: bytes}
	if len(marks) < 2 {
		return s
	}
	first, last := marks[0], marks[len(marks)-1]
	msgs := last.Msgs - first.Msgs
	total := last.At - first.At
	s.Iterations = msgs
	if msgs <= 0 || total <= 0 {
		return s
	}
	sec := total.Seconds()
	s.Seconds = sec
	s.AvgMBps = float64(msgs) * float64(bytes) / sec / MB
	s.MsgRate = float64(msgs) / sec / 1e6
	s.PeakMBps = s.AvgMBps

	span := max(minSpan, (msgs+19)/20, 1)
	// Two pointers: for each start i, j is the first mark at least span
	// messages later; later starts only move j forward.
	j := 0
	for i := 0; i < len(marks); i++ {
		for j < len(marks) && marks[j].Msgs-marks[i].Msgs < span {
			j++
		}
		if j == len(marks) {
			break
		}
		dt := marks[j].At - marks[i].At
		if dt <= 0 {
			continue
		}
		r := float64(marks[j].Msgs-marks[i].Msgs) * float64(bytes) / dt.Seconds() / MB
		s.PeakMBps = max(s.PeakMBps, r)
	}
	return s
}

// MedianBlock summarises the block with the median average rate of a run
// made of blocks, each described by its own marks as for Bandwidth (for
// instance the alternating blocks of an interleaved comparison). On a
// shared machine one stall of the scheduler can stretch a block many times
// and drags the whole run's average with it; the median block is a rate
// one outlier cannot move. With an even number of blocks it is the lower
// median; blocks without a measured duration are skipped, and with none
// left everything is zero.
func MedianBlock(bytes int, blocks [][]Mark, minSpan int) BandwidthStats {
	stats := make([]BandwidthStats, 0, len(blocks))
	for _, b := range blocks {
		if s := Bandwidth(bytes, b, minSpan); s.Seconds > 0 {
			stats = append(stats, s)
		}
	}
	if len(stats) == 0 {
		return BandwidthStats{Bytes: bytes}
	}
	slices.SortStableFunc(stats, func(a, b BandwidthStats) int {
		switch {
		case a.MsgRate < b.MsgRate:
			return -1
		case a.MsgRate > b.MsgRate:
			return 1
		}
		return 0
	})
	return stats[(len(stats)-1)/2]
}

// Check is a derived figure and, optionally, the target it should meet:
// usually a ratio of two figures measured in the same run (docs/DESIGN.md
// section 1: compare as ratios, because the machines are shared and noisy),
// sometimes an absolute figure such as an in-process latency.
type Check struct {
	// Name says what is compared, e.g.
	// "read 8B t_typical / tcp 8B RTT t_typical".
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	// Unit is "x" for ratios, or the unit of an absolute figure ("usec").
	Unit string `json:"unit"`
	// Target is the goal as text ("<= 1.20x"), empty if there is none.
	Target string `json:"target,omitempty"`
	// Met reports whether Value meets Target; nil without a target.
	Met *bool `json:"met,omitempty"`
}

// RatioOf returns the check num/den named name, with no target. A zero den
// gives 0 rather than Inf, which JSON cannot carry.
func RatioOf(name string, num, den float64) Check {
	c := Check{Name: name, Unit: "x"}
	if den != 0 {
		c.Value = num / den
	}
	return c
}

// Figure returns an absolute figure as a check with no target.
func Figure(name string, value float64, unit string) Check {
	return Check{Name: name, Value: value, Unit: unit}
}

// AtMost sets the target "value <= limit" and whether it is met.
func (c Check) AtMost(limit float64) Check {
	met := c.Value <= limit
	c.Target, c.Met = "<= "+c.format(limit), &met
	return c
}

// AtLeast sets the target "value >= limit" and whether it is met.
func (c Check) AtLeast(limit float64) Check {
	met := c.Value >= limit
	c.Target, c.Met = ">= "+c.format(limit), &met
	return c
}

// Below sets the target "value < limit" and whether it is met.
func (c Check) Below(limit float64) Check {
	met := c.Value < limit
	c.Target, c.Met = "< "+c.format(limit), &met
	return c
}

// format renders v in the check's unit: "0.95x", "0.42 usec".
func (c Check) format(v float64) string {
	digits := 2
	if v != 0 && math.Abs(v) < 0.1 {
		digits = 4 // a small ratio keeps its first figures: 0.0081x, not 0.01x
	}
	s := strconv.FormatFloat(v, 'f', digits, 64)
	if c.Unit == "x" || c.Unit == "" {
		return s + "x"
	}
	return s + " " + c.Unit
}

// SizeName writes a size as perftest users say it: 8B, 64KiB, 8MiB.
func SizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
