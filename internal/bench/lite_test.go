package bench

import (
	"strings"
	"testing"

	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/perf"
)

// TestLiteBench runs krbench lite small: the master and krcored in child
// processes (this test binary again) and in this process; every series,
// its ratio with the target, the figures, and the note of its deviation come out.
func TestLiteBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	out := krbenchProcess(t, "lite", "-n", "20", "-spin", "20us", "-timeout", "10s")
	rep := parseTables(t, out)
	for _, place := range []string{placementInproc, placementCross} {
		r := rep.FindAt(place, testLiteRead, perf.ModeLat)
		if r == nil {
			t.Errorf("%s: no %s table", place, testLiteRead)
			continue
		}
		for _, l := range []string{seriesLMR, seriesVQ, seriesLMR + daemonSuffix, seriesVQ + daemonSuffix} {
			if row := r.LabelRow(l); row == nil || row.Iterations != 20 || row.Typical <= 0 {
				t.Errorf("%s: row %s: %+v", place, l, row)
			}
		}
		if r := rep.FindAt(place, testLiteRPC, perf.ModeLat); r == nil {
			t.Errorf("%s: no %s table", place, testLiteRPC)
		} else {
			for _, l := range []string{seriesLiteRPC, seriesQPSendRT, seriesVQSendRT, seriesNetRPC, seriesLiteRPC + daemonSuffix, seriesVQSendRT + daemonSuffix} {
				if row := r.LabelRow(l); row == nil || row.Iterations != 20 || row.Typical <= 0 {
					t.Errorf("%s: row %s: %+v", place, l, row)
				}
			}
		}
		if r := rep.FindAt(place, testLiteMemcpy, perf.ModeLat); r == nil {
			t.Errorf("%s: no %s table", place, testLiteMemcpy)
		} else {
			for _, l := range []string{seriesMemcpy, seriesReadWrite, seriesMemcpy + daemonSuffix, seriesReadWrite + daemonSuffix} {
				if row := r.LabelRow(l); row == nil || row.Iterations != interleave.Blocks || row.Typical <= 0 {
					t.Errorf("%s: row %s: %+v", place, l, row)
				}
			}
		}
		checkTargets(t, rep,
			place+" embedded: lite RPC 8B round trip t_typical / raw-QP SEND round trip t_typical (interleaved)",
			place+" through krcored: lite RPC 8B round trip t_typical / VQ SEND round trip t_typical (interleaved)",
			place+" embedded: lite RPC 8B round trip t_typical / Go net/rpc over TCP t_typical (interleaved)",
			place+" embedded: lite LMR 8B Read t_typical / VQ 8B READ t_typical (interleaved)",
			place+" through krcored: lite LMR 8B Read t_typical / VQ 8B READ t_typical (interleaved)")
	}
	rates, locks, barriers := 0, 0, 0
	for _, c := range rep.Checks {
		if strings.Contains(c.Name, "lite barrier of 8") {
			if c.Value <= 0 {
				t.Errorf("check %q: %v", c.Name, c.Value)
			}
			barriers++
		}
		if strings.Contains(c.Name, "lite lock hand-off") || strings.Contains(c.Name, "lite Lock+Unlock") {
			if c.Value <= 0 {
				t.Errorf("check %q: %v", c.Name, c.Value)
			}
			locks++
		}
		if (strings.Contains(c.Name, "Memcpy") || strings.Contains(c.Name, "calls/s")) && c.Value <= 0 {
			t.Errorf("check %q: %v", c.Name, c.Value)
		}
		if strings.Contains(c.Name, "lite RPC 8B calls/s") {
			rates++
		}
	}
	if barriers != 4 { // 2 placements x embedded, daemon
		t.Errorf("%d barrier figures, want 4: %+v", barriers, rep.Checks)
	}
	if locks != 2 {
		t.Errorf("%d lock figures, want 2 (hand-off, alone): %+v", locks, rep.Checks)
	}
	if rates != 8 { // 2 placements x embedded, daemon x 1, 8 callers
		t.Errorf("%d RPC calls/s figures, want 8: %+v", rates, rep.Checks)
	}
	if !strings.Contains(out, "Deviation") {
		t.Errorf("no note of where the run deviates from the issue:\n%s", out)
	}
}
