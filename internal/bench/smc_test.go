package bench

import (
	"fmt"
	"testing"

	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/perf"
)

// TestSMCBench runs krbench smc small, in one process and across two:
// every table's rows and every ratio with its target come out.
func TestSMCBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	out := krbenchProcess(t, "smc", "-places", "inproc,cross", "-n", "1000", "-msgs", "20", "-spin", "20us", "-timeout", "60s")
	rep := parseTables(t, out)
	labels := []string{seriesSMC, seriesSMC + daemonSuffix, seriesTCP}
	var targets []string
	for _, place := range []string{placementInproc, placementCross} {
		for _, lat := range []struct {
			test string
			min  int
		}{{testSMCRTT, 1000}, {testSMCConnect, 100}, {testSMCConnectFirst, interleave.Blocks}, {testSMCMany, 1000}} {
			r := rep.FindAt(place, lat.test, perf.ModeLat)
			if r == nil {
				t.Errorf("%s: no %s table", place, lat.test)
				continue
			}
			for _, l := range labels {
				if row := r.LabelRow(l); row == nil || row.Iterations < lat.min || row.Typical <= 0 {
					t.Errorf("%s %s: row %s: %+v", place, lat.test, l, row)
				}
			}
		}
		if r := rep.FindAt(place, testSMCStream, perf.ModeBW); r == nil {
			t.Errorf("%s: no %s table", place, testSMCStream)
		} else {
			for _, l := range labels {
				if row := r.BandwidthLabelRow(l); row == nil || row.AvgMBps <= 0 {
					t.Errorf("%s %s: row %s: %+v", place, testSMCStream, l, row)
				}
			}
		}
		for _, via := range []string{"embedded", "through krcored"} {
			for _, what := range []string{
				"SMC later connect t_typical / TCP connect t_typical (interleaved)",
				"SMC 8B RTT t_typical / TCP loopback 8B RTT t_typical (interleaved)",
				"SMC 64KiB stream BW / TCP loopback stream BW (median blocks, interleaved)",
			} {
				targets = append(targets, fmt.Sprintf("%s %s: %s", place, via, what))
			}
		}
	}
	checkTargets(t, rep, targets...)
}
