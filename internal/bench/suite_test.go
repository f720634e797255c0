package bench

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/perf"
)

// parseTables parses krbench's text output and fails the test on junk.
func parseTables(t *testing.T, out string) *perf.Report {
	t.Helper()
	rep, err := perf.ParseText(strings.NewReader(out))
	if err != nil {
		t.Fatalf("output does not parse: %v\n%s", err, out)
	}
	return rep
}

// checkSuite asserts the tables of a suite run with -n iters at placement.
func checkSuite(t *testing.T, rep *perf.Report, placement string, iters int, tests ...string) {
	t.Helper()
	for _, test := range tests {
		if test == testConnect {
			r := rep.FindAt(placement, testConnect, perf.ModeLat)
			if r == nil {
				t.Errorf("%s: no connect table", placement)
				continue
			}
			for _, ph := range phases {
				row := r.LabelRow(ph)
				if row == nil || row.Iterations != iters || row.Typical <= 0 {
					t.Errorf("%s connect phase %s: %+v", placement, ph, row)
				}
			}
			continue
		}
		size := 8
		if test != testAtomic {
			size = 64 << 10
		}
		lat, bw := rep.FindAt(placement, test, perf.ModeLat), rep.FindAt(placement, test, perf.ModeBW)
		if lat == nil || bw == nil {
			t.Errorf("%s %s: lat table %v, bw table %v", placement, test, lat != nil, bw != nil)
			continue
		}
		if row := lat.LatencyRow(8); row == nil || row.Iterations != iters || row.Min <= 0 || row.Min > row.Typical || row.Typical > row.Max {
			t.Errorf("%s %s lat 8 B row: %+v", placement, test, row)
		}
		if row := bw.BandwidthRow(size); row == nil || row.Iterations != iters || row.AvgMBps <= 0 || row.PeakMBps < row.AvgMBps*0.99 {
			t.Errorf("%s %s bw %d B row: %+v", placement, test, size, row)
		}
	}
}

func TestInproc(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, stderr := runKrbench(t, ctx, "-inproc", "-n", "20", "-test", "read,write,send,atomic,connect")
	if code != 0 {
		t.Fatalf("exit %d\nstderr: %s\nstdout: %s", code, stderr, out)
	}
	rep := parseTables(t, out)
	checkSuite(t, rep, placementInproc, 20, testRead, testWrite, testSend, testAtomic, testConnect)
	checkTargets(t, rep, "in-process krcore warm connect t_typical")
	found := false
	for _, c := range rep.Checks {
		if c.Name == "in-process read 8B t_typical" && c.Unit == "usec" && c.Met != nil {
			found = true
		}
	}
	if !found {
		t.Errorf("no in-process READ target in checks: %+v", rep.Checks)
	}
}

func TestInprocJSONAllSizes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, stderr := runKrbench(t, ctx, "-inproc", "-json", "-n", "2", "-a", "read-lat", "send-bw")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep perf.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if r := rep.Find(testRead, perf.ModeLat); r == nil || len(r.Latency) != 23 || r.Latency[22].Bytes != 8<<20 {
		t.Fatalf("read lat over -a sizes: %+v", r)
	}
	if r := rep.Find(testSend, perf.ModeBW); r == nil || len(r.Bandwidth) != 23 {
		t.Fatalf("send bw over -a sizes: %+v", r)
	}
	if rep.Find(testRead, perf.ModeBW) != nil || rep.Find(testSend, perf.ModeLat) != nil {
		t.Error("ran a mode nobody asked for")
	}
}

// TestCrossProcess runs the demo: this test binary re-executed as krbench
// starts a server child (itself again) and runs the suite against it over
// the soft fabric's shared-memory link, then the raw tests over its TCP
// link, then in process.
func TestCrossProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	start := time.Now()
	stdout := krbenchProcess(t, "demo", "-n", "20", "-timeout", "5s")
	t.Logf("demo with -n 20 took %v", time.Since(start))
	rep := parseTables(t, stdout)
	checkSuite(t, rep, placementCross, 20, testRead, testWrite, testSend, testAtomic, testConnect)
	checkSuite(t, rep, placementInproc, 20, testRead, testWrite, testSend, testAtomic, testConnect)
	checkKrcore(t, rep, placementCross, 20)
	checkKrcore(t, rep, placementInproc, 20)
	checkLocal(t, rep, 20)
	if n := strings.Count(stdout, testClusterTitle); n != 1 {
		t.Errorf("walkthrough printed %d times, want once", n)
	}
	if i, j := strings.Index(stdout, testClusterTitle), strings.Index(stdout, "TCP ping-pong Latency Test"); i < 0 || j < 0 || i > j {
		t.Errorf("the walkthrough does not come first")
	}
	checkTargets(t, rep,
		"cross-process krcore warm connect t_typical",
		"cross-process krcore warm connects/s, 1 goroutine(s), median block",
		"cross-process krcore cold connect / 8B READ to the MetaServer node t_typical (interleaved)",
		"cross-process raw RC connect total / krcore warm connect t_typical",
		"cross-process VQ 8B READ t_typical / raw QP t_typical (interleaved)")
	if r := rep.FindAt(placementCross, testRaw, perf.ModeLat); r == nil || r.LatencyRow(8) == nil {
		t.Error("no TCP ping-pong baseline")
	}
	if r := rep.FindAt(placementCross, testRaw, perf.ModeBW); r == nil || r.BandwidthRow(64<<10) == nil {
		t.Error("no TCP stream baseline")
	}
	if r := rep.FindAt(placementCross, testPairRead, perf.ModeLat); r == nil || r.LabelRow(seriesTCP) == nil || r.LabelRow(testRead) == nil {
		t.Errorf("no interleaved READ/TCP table: %+v", r)
	}
	if r := rep.FindAt(placementCross, testPairWrite, perf.ModeBW); r == nil || r.BandwidthLabelRow(seriesTCP) == nil || r.BandwidthLabelRow(testWrite) == nil {
		t.Errorf("no interleaved WRITE/TCP table: %+v", r)
	}
	targets := map[string]bool{}
	for _, c := range rep.Checks {
		if c.Target != "" {
			targets[c.Name] = true
		}
		if c.Value <= 0 {
			t.Errorf("check %q = %v", c.Name, c.Value)
		}
	}
	for _, want := range []string{
		"tcp-link read 8B t_typical / tcp 8B RTT t_typical (interleaved)",
		"tcp-link write 64KiB BW average / tcp 64KiB stream BW average (interleaved)",
		"write 64KiB BW average / tcp 64KiB stream BW average (interleaved)",
		"read 64KiB BW average / tcp 64KiB stream BW average (interleaved)",
		"in-process read 8B t_typical",
	} {
		if !targets[want] {
			t.Errorf("no target check %q; checks: %+v", want, rep.Checks)
		}
	}
	// The shared-memory link's figures sit beside the TCP link's, with
	// issue 16's targets (the round trips' soft until met).
	for _, want := range []string{"read 8B t_typical / tcp 8B RTT t_typical (interleaved)", "send 8B ping-pong RTT / tcp 8B RTT t_typical"} {
		found := false
		for _, c := range rep.Checks {
			found = found || c.Name == want && c.Target != "" || strings.HasPrefix(c.Name, want+" [issue 16 target")
		}
		if !found {
			t.Errorf("no shared-memory link check %q", want)
		}
	}
	checkSuite(t, rep, placementCrossTCP, 20, testRead, testWrite, testSend)
}

// checkKrcore asserts the KRCore tables of a run with -n iters at placement.
func checkKrcore(t *testing.T, rep *perf.Report, placement string, iters int) {
	t.Helper()
	r := rep.FindAt(placement, testKrConnect, perf.ModeLat)
	if r == nil {
		t.Fatalf("%s: no KRCore connect table", placement)
	}
	for _, s := range []string{seriesCold, seriesWarm, seriesMetaRead, seriesRead8} {
		if row := r.LabelRow(s); row == nil || row.Iterations != iters || row.Typical <= 0 || row.Min > row.Typical {
			t.Errorf("%s KRCore connect %s: %+v", placement, s, row)
		}
	}
	if cold, warm := r.LabelRow(seriesCold), r.LabelRow(seriesWarm); cold != nil && warm != nil && warm.Typical >= cold.Typical {
		t.Errorf("%s: warm connect (%v usec) not cheaper than cold (%v usec)", placement, warm.Typical, cold.Typical)
	}
	if r := rep.FindAt(placement, testKrRate, perf.ModeBW); r == nil || r.BandwidthLabelRow("1") == nil || r.BandwidthLabelRow("1"+medianSuffix) == nil || r.BandwidthLabelRow("1"+medianSuffix).MsgRate <= 0 {
		t.Errorf("%s: connect rate table %+v", placement, r)
	}
	for _, test := range []string{testVQRead, testVQWrite, testVQSend} {
		r := rep.FindAt(placement, test, perf.ModeLat)
		if r == nil {
			t.Errorf("%s: no %s lat table", placement, test)
			continue
		}
		for _, s := range []string{seriesVQ, seriesQP} {
			if row := r.LabelRow(s); row == nil || row.Iterations != iters || row.Typical <= 0 {
				t.Errorf("%s %s lat %s: %+v", placement, test, s, row)
			}
		}
		if test == testVQSend {
			continue
		}
		b := rep.FindAt(placement, test, perf.ModeBW)
		if b == nil {
			t.Errorf("%s: no %s bw table", placement, test)
			continue
		}
		for _, s := range []string{seriesVQ, seriesQP} {
			if row := b.BandwidthLabelRow(s); row == nil || row.Iterations != iters || row.MsgRate <= 0 {
				t.Errorf("%s %s bw %s: %+v", placement, test, s, row)
			}
			if row := b.BandwidthLabelRow(s + medianSuffix); row == nil || row.Iterations != iters/interleave.Blocks || row.MsgRate <= 0 {
				t.Errorf("%s %s bw %s: %+v", placement, test, s+medianSuffix, row)
			}
		}
	}
}

// checkLocal asserts the walkthrough and mesh tables (always in-process).
func checkLocal(t *testing.T, rep *perf.Report, iters int) {
	t.Helper()
	r := rep.FindAt(placementInproc, testCluster, perf.ModeLat)
	if r == nil {
		t.Fatal("no walkthrough table")
	}
	for _, s := range []string{stepUp, stepCold, stepWarm, stepRC, stepRead, stepWrite, stepSendRTT} {
		row := r.LabelRow(s)
		if row == nil || row.Iterations < 1 || row.Typical <= 0 {
			t.Errorf("walkthrough step %s: %+v", s, row)
		}
	}
	m := rep.FindAt(placementInproc, testMesh, perf.ModeLat)
	if m == nil {
		t.Fatal("no mesh table")
	}
	for _, s := range []string{seriesKrcore, seriesRC} {
		if row := m.LabelRow(s); row == nil || row.Iterations != iters || row.Typical <= 0 {
			t.Errorf("mesh %s: %+v", s, row)
		}
	}
}

// checkTargets asserts that every named check is there with a target.
func checkTargets(t *testing.T, rep *perf.Report, names ...string) {
	t.Helper()
	got := map[string]perf.Check{}
	for _, c := range rep.Checks {
		got[c.Name] = c
	}
	for _, n := range names {
		c, ok := got[n]
		if !ok || c.Met == nil || c.Target == "" || c.Value <= 0 {
			t.Errorf("check %q: %+v (present %v); checks: %+v", n, c, ok, rep.Checks)
		}
	}
}

func TestInprocKrcore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, stderr := runKrbench(t, ctx, "-inproc", "-n", "20", "-nodes", "3", "krcore")
	if code != 0 {
		t.Fatalf("exit %d\nstderr: %s\nstdout: %s", code, stderr, out)
	}
	rep := parseTables(t, out)
	checkKrcore(t, rep, placementInproc, 20)
	checkLocal(t, rep, 20)
	checkTargets(t, rep,
		"in-process krcore warm connect t_typical",
		"in-process krcore warm connects/s, 1 goroutine(s), median block")
	for _, c := range rep.Checks {
		if c.Name == "in-process full mesh of 3 nodes: raw RC / krcore t_typical (interleaved)" && c.Value > 0 {
			return
		}
	}
	t.Errorf("no mesh ratio in checks: %+v", rep.Checks)
}

func TestInprocVQJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, stderr := runKrbench(t, ctx, "-inproc", "-json", "-n", "10", "vq-lat")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep perf.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	for _, test := range []string{testVQRead, testVQWrite, testVQSend} {
		r := rep.Find(test, perf.ModeLat)
		if r == nil || r.LabelRow(seriesVQ) == nil || r.LabelRow(seriesQP) == nil || r.LabelRow(seriesVQ).Iterations != 10 {
			t.Errorf("%s lat: %+v", test, r)
		}
		if rep.Find(test, perf.ModeBW) != nil {
			t.Errorf("%s: ran bw, asked for lat only", test)
		}
	}
}
