package bench

import (
	"testing"

	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/perf"
)

// TestSMCBench runs krbench smc small: every series' row and every ratio
// with its target come out.
func TestSMCBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	out := krbenchProcess(t, "smc", "-n", "20", "-msgs", "20", "-spin", "20us", "-timeout", "30s")
	rep := parseTables(t, out)
	labels := []string{seriesSMC, seriesSMC + daemonSuffix, seriesTCP}
	if r := rep.FindAt(placementInproc, testSMCRTT, perf.ModeLat); r == nil {
		t.Errorf("no %s table", testSMCRTT)
	} else {
		for _, l := range labels {
			if row := r.LabelRow(l); row == nil || row.Iterations != 20 || row.Typical <= 0 {
				t.Errorf("%s: row %s: %+v", testSMCRTT, l, row)
			}
		}
	}
	if r := rep.FindAt(placementInproc, testSMCStream, perf.ModeBW); r == nil {
		t.Errorf("no %s table", testSMCStream)
	} else {
		for _, l := range labels {
			if row := r.BandwidthLabelRow(l); row == nil || row.AvgMBps <= 0 {
				t.Errorf("%s: row %s: %+v", testSMCStream, l, row)
			}
		}
	}
	if r := rep.FindAt(placementInproc, testSMCConnect, perf.ModeLat); r == nil {
		t.Errorf("no %s table", testSMCConnect)
	} else {
		for _, l := range labels {
			if row := r.LabelRow(l); row == nil || row.Iterations < interleave.Blocks || row.Typical <= 0 {
				t.Errorf("%s: row %s: %+v", testSMCConnect, l, row)
			}
		}
	}
	checkTargets(t, rep,
		"in-process embedded: SMC later connect t_typical / TCP connect t_typical (interleaved)",
		"in-process through krcored: SMC later connect t_typical / TCP connect t_typical (interleaved)",
		"in-process embedded: SMC 8B RTT t_typical / TCP loopback 8B RTT t_typical (interleaved)",
		"in-process through krcored: SMC 8B RTT t_typical / TCP loopback 8B RTT t_typical (interleaved)",
		"in-process embedded: SMC 64KiB stream BW / TCP loopback stream BW (median blocks, interleaved)",
		"in-process through krcored: SMC 64KiB stream BW / TCP loopback stream BW (median blocks, interleaved)")
}
