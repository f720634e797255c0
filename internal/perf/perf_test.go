package perf

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func us(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestLatencyKnownSamples(t *testing.T) {
	// 1..1000 usec, shuffled: the statistics must not depend on order.
	samples := make([]time.Duration, 1000)
	for i := range samples {
		samples[i] = us(float64(i + 1))
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(samples), func(i, j int) { samples[i], samples[j] = samples[j], samples[i] })
	orig := append([]time.Duration(nil), samples...)

	s := Latency(8, samples)
	if s.Bytes != 8 || s.Iterations != 1000 {
		t.Fatalf("bytes/iters = %d/%d", s.Bytes, s.Iterations)
	}
	checks := []struct {
		name      string
		got, want float64
	}{
		{"min", s.Min, 1},
		{"max", s.Max, 1000},
		{"typical (median of even count)", s.Typical, 500.5},
		{"avg", s.Avg, 500.5},
		// Population stdev of 1..n is sqrt((n^2-1)/12).
		{"stdev", s.Stdev, math.Sqrt((1000*1000 - 1) / 12.0)},
		// perftest: sorted[ceil(999*0.99)] = sorted[990] = 991.
		{"p99", s.P99, 991},
		// sorted[ceil(999*0.999)] = sorted[999]: the max, as ib_read_lat.
		{"p99.9", s.P999, 1000},
	}
	for _, c := range checks {
		if !near(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	for i := range samples {
		if samples[i] != orig[i] {
			t.Fatal("Latency reordered its input")
		}
	}
}

func TestLatencyOddAndTiny(t *testing.T) {
	s := Latency(2, []time.Duration{us(3), us(1), us(2)})
	if s.Typical != 2 || s.Min != 1 || s.Max != 3 || s.P99 != 3 {
		t.Errorf("odd: %+v", s)
	}
	one := Latency(2, []time.Duration{us(7)})
	if one.Min != 7 || one.Max != 7 || one.Typical != 7 || one.Stdev != 0 || one.P999 != 7 {
		t.Errorf("one sample: %+v", one)
	}
	zero := Latency(2, nil)
	if zero != (LatencyStats{Bytes: 2}) {
		t.Errorf("no samples: %+v", zero)
	}
}

func TestPercentileIndex(t *testing.T) {
	for _, c := range []struct {
		n    int
		p    float64
		want int
	}{
		{0, 0.99, 0}, {1, 0.99, 0}, {2, 0.99, 1}, {100, 0.99, 99}, {101, 0.99, 99},
		{1000, 0.99, 990}, {1000, 0.999, 999}, {10000, 0.999, 9990}, {5, 0.5, 2}, {10, 0, 0}, {10, 1, 9},
	} {
		if got := Percentile(c.n, c.p); got != c.want {
			t.Errorf("Percentile(%d, %v) = %d, want %d", c.n, c.p, got, c.want)
		}
	}
}

func TestBandwidth(t *testing.T) {
	// 100 messages of 1 MiB in 1 s, with the second half twice as fast as
	// the first: average 100 MB/s, peak (over >= 5% of the run) faster.
	marks := []Mark{{}}
	at := time.Duration(0)
	for i := 1; i <= 100; i++ {
		step := 40 * time.Millisecond / 3 // first 50: 2/3 s total
		if i > 50 {
			step = 20 * time.Millisecond / 3 // last 50: 1/3 s
		}
		at += step
		marks = append(marks, Mark{At: at, Msgs: i})
	}
	s := Bandwidth(MB, marks, 1)
	if s.Iterations != 100 || s.Bytes != MB {
		t.Fatalf("%+v", s)
	}
	if math.Abs(s.AvgMBps-100) > 0.01 {
		t.Errorf("avg = %v, want 100", s.AvgMBps)
	}
	if math.Abs(s.PeakMBps-150) > 0.5 {
		t.Errorf("peak = %v, want ~150 (the fast half)", s.PeakMBps)
	}
	if math.Abs(s.MsgRate-100e-6) > 1e-9 {
		t.Errorf("msg rate = %v Mpps, want 0.0001", s.MsgRate)
	}

	// A single burst of 2 messages in 1 ns must not become the peak when
	// the span is a transmit window of 10.
	burst := []Mark{{}, {At: time.Second / 2, Msgs: 10}, {At: time.Second/2 + 1, Msgs: 12}, {At: time.Second, Msgs: 20}}
	if b := Bandwidth(1, burst, 10); b.PeakMBps > 2*b.AvgMBps {
		t.Errorf("burst inflated the peak: %+v", b)
	}
	if z := Bandwidth(8, []Mark{{}}, 1); z.AvgMBps != 0 || z.Iterations != 0 {
		t.Errorf("one mark: %+v", z)
	}
}

func TestMedianBlock(t *testing.T) {
	block := func(msgs int, d time.Duration) []Mark {
		return []Mark{{}, {At: d / 2, Msgs: msgs / 2}, {At: d, Msgs: msgs}}
	}
	// Five blocks of 100 messages; one stalled 100x.
	blocks := [][]Mark{
		block(100, 100*time.Microsecond),
		block(100, 10*time.Millisecond), // the stall
		block(100, 80*time.Microsecond),
		block(100, 120*time.Microsecond),
		block(100, 90*time.Microsecond),
	}
	s := MedianBlock(8, blocks, 1)
	if s.Iterations != 100 || !near(s.Seconds, 100e-6) || !near(s.MsgRate, 1.0) {
		t.Errorf("median block = %+v, want the 100 us one (1 Mpps)", s)
	}
	// Even count: the lower median.
	s = MedianBlock(8, blocks[:4], 1)
	if !near(s.Seconds, 120e-6) {
		t.Errorf("lower median of 4 = %+v, want the 120 us block", s)
	}
	if s := MedianBlock(8, [][]Mark{{{}}, nil}, 1); s.Iterations != 0 || s.MsgRate != 0 || s.Bytes != 8 {
		t.Errorf("no measured block: %+v", s)
	}
}

func TestChecks(t *testing.T) {
	c := RatioOf("read / tcp", 1.1, 1.0).AtMost(1.2)
	if c.Met == nil || !*c.Met || c.Target != "<= 1.20x" || c.Unit != "x" {
		t.Errorf("%+v", c)
	}
	c = RatioOf("write / tcp", 0.5, 1.0).AtLeast(0.8)
	if c.Met == nil || *c.Met {
		t.Errorf("0.5 >= 0.8 reported met: %+v", c)
	}
	if z := RatioOf("x", 1, 0); z.Value != 0 {
		t.Errorf("division by zero gave %v", z.Value)
	}
	f := Figure("inproc read", 0.42, "usec").Below(1)
	if !*f.Met || f.Target != "< 1.00 usec" {
		t.Errorf("%+v", f)
	}
}

func sampleReport() *Report {
	var s []time.Duration
	for i := range 1000 {
		s = append(s, us(1.5+float64(i%37)/100))
	}
	phase := Latency(0, s)
	phase.Label = "first_op"
	return &Report{
		Tool: "krbench",
		Results: []Result{
			{Title: "RDMA_Read Latency Test", Test: "read", Mode: ModeLat, Placement: "cross-process",
				Info:    []Field{{"Transport", "soft RC"}, {"Fabric", "TCP: a:1 <-> b:2"}},
				Latency: []LatencyStats{Latency(8, s), Latency(8<<20, s)}},
			{Title: "Connect", Test: "connect", Mode: ModeLat, Column: "phase", Latency: []LatencyStats{phase}},
			{Title: "RDMA_Write BW Test", Test: "write", Mode: ModeBW,
				Bandwidth: []BandwidthStats{Bandwidth(65536, []Mark{{}, {At: time.Second / 2, Msgs: 2000}, {At: time.Second, Msgs: 5000}}, 128)}},
			{Title: "Interleaved", Test: "pair", Mode: ModeBW, Column: "series", Bandwidth: []BandwidthStats{
				func() BandwidthStats {
					b := Bandwidth(65536, []Mark{{}, {At: time.Second, Msgs: 100}}, 1)
					b.Label = "tcp"
					return b
				}(),
			}},
		},
		Checks: []Check{
			RatioOf("read 8B t_typical / tcp 8B RTT t_typical", 1, 1.1).AtMost(1.2),
			RatioOf("write 64KiB BW / tcp stream BW", 0.5, 1).AtLeast(0.8),
			Figure("inproc read 8B t_typical", 0.31, "usec").Below(1),
			RatioOf("send 8B / tcp", 2, 1),
		},
	}
}

func TestTextShapeAndRoundTrip(t *testing.T) {
	rep := sampleReport()
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{LatencyHeader, BandwidthHeader, " Transport       : soft RC", "(target <= 1.20x: met)", "(target >= 0.80x: MISSED)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Each latency value starts under its header column, as perftest.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, " 8 ") {
			if got, want := strings.Index(line, "1.50"), strings.Index(LatencyHeader, "t_min"); got != want {
				t.Errorf("t_min at column %d, header at %d:\n%s\n%s", got, want, LatencyHeader, line)
			}
		}
	}

	// Logs between tables must not confuse the parser.
	got, err := ParseText(strings.NewReader("krbench: connecting\n" + out + "note: done\n"))
	if err != nil {
		t.Fatalf("ParseText: %v\n%s", err, out)
	}
	if len(got.Results) != 4 || len(got.Checks) != 4 {
		t.Fatalf("parsed %d results, %d checks", len(got.Results), len(got.Checks))
	}
	lat := got.Results[0]
	if lat.Mode != ModeLat || lat.Title != "RDMA_Read Latency Test" || lat.Test != "read" || lat.Placement != "cross-process" ||
		len(lat.Info) != 2 || lat.Info[1].Value != "TCP: a:1 <-> b:2" {
		t.Errorf("latency table: %+v", lat)
	}
	want := rep.Results[0].Latency[1]
	row := lat.LatencyRow(8 << 20)
	if row == nil || row.Iterations != 1000 || math.Abs(row.Typical-want.Typical) > 0.005 || math.Abs(row.P999-want.P999) > 0.005 {
		t.Errorf("8 MiB row = %+v, want %+v", row, want)
	}
	if got.FindAt("cross-process", "read", ModeLat) == nil || got.FindAt("in-process", "read", ModeLat) != nil {
		t.Error("FindAt does not tell placements apart")
	}
	if c := got.Results[1]; c.Column != "phase" || c.LabelRow("first_op") == nil {
		t.Errorf("connect table: %+v", c)
	}
	bw := got.Results[2].BandwidthRow(65536)
	wbw := rep.Results[2].Bandwidth[0]
	if bw == nil || bw.Iterations != 5000 || math.Abs(bw.AvgMBps-wbw.AvgMBps) > 0.005 || math.Abs(bw.PeakMBps-wbw.PeakMBps) > 0.005 {
		t.Errorf("bw row = %+v, want %+v", bw, wbw)
	}
	if p := got.Find("pair", ModeBW); p == nil || p.Column != "series" || p.BandwidthLabelRow("tcp") == nil || p.BandwidthLabelRow("tcp").Iterations != 100 {
		t.Errorf("labelled bandwidth table: %+v", p)
	}
	for i, c := range got.Checks {
		w := rep.Checks[i]
		if c.Name != w.Name || math.Abs(c.Value-w.Value) > 0.005 || c.Unit != w.Unit || c.Target != w.Target || (c.Met == nil) != (w.Met == nil) || (c.Met != nil && *c.Met != *w.Met) {
			t.Errorf("check %d = %+v, want %+v", i, c, w)
		}
	}
}

func TestParseTextRejectsBrokenTables(t *testing.T) {
	for name, text := range map[string]string{
		"short row":  Separator + "\n T\n" + Separator + "\n" + LatencyHeader + "\n 8 1000 1.0\n" + Separator + "\n",
		"bad number": Separator + "\n T\n" + Separator + "\n" + BandwidthHeader + "\n 8 x 1 2 3\n" + Separator + "\n",
		"no rule":    Separator + "\n T\n" + Separator + "\n" + BandwidthHeader + "\n 8 1 1 2 3\n",
		"bad header": Separator + "\n T\n" + Separator + "\n #what\n" + Separator + "\n",
	} {
		if _, err := ParseText(strings.NewReader(text)); !errors.Is(err, ErrParse) {
			t.Errorf("%s: err = %v, want ErrParse", name, err)
		}
	}
	if rep, err := ParseText(strings.NewReader("no tables here\n")); err != nil || len(rep.Results) != 0 {
		t.Errorf("plain text: %v %+v", err, rep)
	}
}

func TestJSON(t *testing.T) {
	rep := sampleReport()
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"t_typical_usec"`, `"p99_9_usec"`, `"bw_average_mb_per_sec"`, `"msg_rate_mpps"`, `"met": false`, `"mode": "bw"`} {
		if !strings.Contains(buf.String(), key) {
			t.Errorf("JSON lacks %s:\n%s", key, buf.String())
		}
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if r := back.Find("read", ModeLat); r == nil || *r.LatencyRow(8) != rep.Results[0].Latency[0] {
		t.Errorf("read lat did not round-trip: %+v", r)
	}
	if r := back.Find("write", ModeBW); r == nil || r.Bandwidth[0] != rep.Results[2].Bandwidth[0] {
		t.Errorf("write bw did not round-trip: %+v", r)
	}
	if back.Find("write", ModeLat) != nil {
		t.Error("Find matched the wrong mode")
	}
}
