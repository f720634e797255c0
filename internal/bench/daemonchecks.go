package bench

import (
	"fmt"

	"github.com/krcore/krcore/internal/perf"
)

// deriveDaemonChecks adds the daemon comparison's ratios and targets.
func deriveDaemonChecks(rep *perf.Report) []perf.Check {
	var out []perf.Check
	for _, t := range []struct{ test, what string }{{testDRead, "8B READ"}, {testDWrite, "8B WRITE"}, {testDSend, "64B SEND RTT"}} {
		r := rep.FindAt(placementCross, t.test, perf.ModeLat)
		if r == nil {
			continue
		}
		e, d := r.LabelRow(seriesEmbedded), r.LabelRow(seriesDaemon)
		if e == nil || d == nil {
			continue
		}
		if t.test == testDRead {
			out = append(out, perf.Figure("daemon 8B READ t_typical minus embedded 8B READ t_typical", d.Typical-e.Typical, " usec").
				AtMost(targetDaemonReadPlusUsec))
			if r := rep.FindAt(placementCross, testDReadOwn, perf.ModeLat); r != nil {
				if e, d := r.LabelRow(seriesEmbedded), r.LabelRow(seriesDaemon); e != nil && d != nil {
					out = append(out, perf.Figure("own node: daemon 8B READ t_typical minus embedded t_typical", d.Typical-e.Typical, " usec").
						AtMost(targetDaemonReadPlusUsec))
				}
			}
		}
		out = append(out, perf.RatioOf(fmt.Sprintf("daemon %s t_typical / embedded t_typical", t.what), d.Typical, e.Typical),
			perf.RatioOf(fmt.Sprintf("daemon %s 99%% / embedded 99%%", t.what), d.P99, e.P99))
	}
	for _, t := range []struct{ test, what string }{{testDRead, "8B READ"}, {testDWrite, "8B WRITE"}} {
		r := rep.FindAt(placementCross, t.test, perf.ModeBW)
		if r == nil {
			continue
		}
		e, d := r.BandwidthLabelRow(seriesEmbedded+medianSuffix), r.BandwidthLabelRow(seriesDaemon+medianSuffix)
		if e != nil && d != nil {
			out = append(out, perf.RatioOf(fmt.Sprintf("daemon %s MsgRate / embedded MsgRate (median blocks)", t.what), d.MsgRate, e.MsgRate))
		}
	}
	if r := rep.FindAt(placementCross, testDConnect, perf.ModeLat); r != nil {
		if e, d := r.LabelRow(seriesEmbedded), r.LabelRow(seriesDaemon); e != nil && d != nil {
			out = append(out, perf.Figure("warm connect through the daemon t_typical", d.Typical, " usec").Below(targetDaemonConnectUsec),
				perf.Figure("warm connect embedded t_typical", e.Typical, " usec"))
		}
	}
	return out
}
