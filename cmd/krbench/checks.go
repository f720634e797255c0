package main

import (
	"fmt"

	"github.com/krcore/krcore/perf"
)

// The targets for the soft fabric.
const (
	// A cross-process 8 B READ is one request and one response over the
	// fabric's TCP link, so it should cost about one TCP round trip.
	targetReadVsTCP = 1.2
	// A 64 KiB WRITE stream should move nearly what one TCP stream does.
	targetWriteVsTCP = 0.8
	// In process, a READ is a function call and a copy: under 1 usec.
	targetInprocReadUsec = 1.0
)

// deriveChecks compares every soft-fabric figure with the TCP baseline of
// the same placement and size, and adds the in-process absolute target.
// The cross-process targets are judged on the interleaved runs when there
// are any (see pair.go), since only they see the same machine as their
// baseline; the plain ratios then come without a target.
func deriveChecks(rep *perf.Report) []perf.Check {
	var out []perf.Check
	for _, place := range []string{placementCross, placementInproc} {
		prefix := ""
		if place == placementInproc {
			prefix = "in-process "
		}
		pairRead, pairWrite := false, false
		if r := rep.FindAt(place, testPairRead, perf.ModeLat); r != nil {
			t, rd := r.LabelRow(seriesTCP), r.LabelRow(testRead)
			if t != nil && rd != nil {
				c := perf.RatioOf(fmt.Sprintf("%sread %s t_typical / tcp %s RTT t_typical (interleaved)", prefix, sizeName(pairLatSize), sizeName(pairLatSize)), rd.Typical, t.Typical)
				if place == placementCross {
					c = c.AtMost(targetReadVsTCP)
				}
				out = append(out, c)
				pairRead = true
			}
		}
		if r := rep.FindAt(place, testPairWrite, perf.ModeBW); r != nil {
			t, w := r.BandwidthLabelRow(seriesTCP), r.BandwidthLabelRow(testWrite)
			if t != nil && w != nil {
				c := perf.RatioOf(fmt.Sprintf("%swrite %s BW average / tcp %s stream BW average (interleaved)", prefix, sizeName(pairBWSize), sizeName(pairBWSize)), w.AvgMBps, t.AvgMBps)
				if place == placementCross {
					c = c.AtLeast(targetWriteVsTCP)
				}
				out = append(out, c)
				pairWrite = true
			}
		}
		rawLat := rep.FindAt(place, testRaw, perf.ModeLat)
		rawBW := rep.FindAt(place, testRaw, perf.ModeBW)
		for _, test := range []string{testRead, testWrite, testSend, testAtomic} {
			if r := rep.FindAt(place, test, perf.ModeLat); r != nil && rawLat != nil {
				for _, row := range r.Latency {
					base := rawLat.LatencyRow(row.Bytes)
					if base == nil {
						continue
					}
					sz := sizeName(row.Bytes)
					name := fmt.Sprintf("%s%s %s t_typical / tcp %s RTT t_typical", prefix, test, sz, sz)
					num := row.Typical
					if test == testSend {
						// The table holds half round trips; compare round trips.
						name = fmt.Sprintf("%ssend %s ping-pong RTT / tcp %s RTT t_typical", prefix, sz, sz)
						num *= 2
					}
					c := perf.RatioOf(name, num, base.Typical)
					if test == testRead && row.Bytes == pairLatSize && place == placementCross && !pairRead {
						c = c.AtMost(targetReadVsTCP)
					}
					out = append(out, c)
				}
			}
			if r := rep.FindAt(place, test, perf.ModeBW); r != nil && rawBW != nil {
				for _, row := range r.Bandwidth {
					base := rawBW.BandwidthRow(row.Bytes)
					if base == nil {
						continue
					}
					sz := sizeName(row.Bytes)
					c := perf.RatioOf(fmt.Sprintf("%s%s %s BW average / tcp %s stream BW average", prefix, test, sz, sz), row.AvgMBps, base.AvgMBps)
					if test == testWrite && row.Bytes == pairBWSize && place == placementCross && !pairWrite {
						c = c.AtLeast(targetWriteVsTCP)
					}
					out = append(out, c)
				}
			}
		}
	}
	if r := rep.FindAt(placementInproc, testRead, perf.ModeLat); r != nil {
		if row := r.LatencyRow(8); row != nil {
			out = append(out, perf.Figure("in-process read 8B t_typical", row.Typical, "usec").Below(targetInprocReadUsec))
		}
	}
	if r := rep.FindAt(placementCross, testConnect, perf.ModeLat); r != nil {
		if row := r.LabelRow("total"); row != nil {
			out = append(out, perf.Figure("cross-process RC connect total t_typical", row.Typical, "usec"))
		}
	}
	return out
}

// sizeName writes a size as perftest users say it: 8B, 64KiB, 8MiB.
func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
