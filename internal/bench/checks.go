package bench

import (
	"fmt"
	"io"
	"strings"

	"github.com/krcore/krcore/internal/bench/report"
	"github.com/krcore/krcore/internal/perf"
)

// The targets for the soft fabric.
const (
	// A cross-process 8 B READ on the TCP link (between hosts, or forced)
	// is one request and one response over it, so it should cost about one
	// TCP round trip.
	targetReadVsTCP = 1.2
	// A 64 KiB WRITE or READ stream should move nearly what one TCP
	// stream does.
	targetWriteVsTCP  = 0.8
	targetReadBWVsTCP = 0.8
	// In process, a READ is a function call and a copy: under 1 usec.
	targetInprocReadUsec = 1.0

	// KRCore (the item 8). A warm connect is a table lookup: under
	// 1 usec, over a million per second on one core.
	targetWarmConnectUsec = 1.0
	targetWarmConnectMps  = 1.0
	// A cold connect is one MetaServer READ and bookkeeping.
	targetColdVsRead = 1.3
	// A raw RC connection costs a handshake with the peer; a warm VQ
	// connect does not.
	targetRCVsWarm = 100
	// A VQ adds little to a private QP's sync 8 B READ: across processes
	// (on one host the shared-memory link), within 1.1x, issue 16's
	// target ("KRCore's own figures on the shm link").
	targetVQVsQPRead = 1.1

	// Issue 16: two processes of one host on the shared-memory link move
	// memory at memory speed, not at TCP's.
	targetShmReadVsTCP = 0.1
	targetShmBWVsTCP   = 2.0
	targetShmSendVsTCP = 0.15

	// In one process (issue 16 section 3) a raw QP's request is a
	// function call of the soft RNIC, so the runtime's own work shows: a
	// VQ's 8 B READ within 1.3x a raw QP's, its 64 B SEND round trip within
	// 1.5x, its 8 B READ message rate at least 0.9x. Soft targets (see
	// goal): a miss is named, not enforced by -check, until most
	// runs on the shared two-core machine meet them (MEASUREMENTS.md,
	// "Runtime cost").
	targetVQVsQPReadInproc = 1.3
	targetVQSendInproc     = 1.5
	targetVQReadRateInproc = 0.9
)

// linkTargets are the soft fabric's targets at a placement: the TCP link's
// across processes forced onto it, the shared-memory link's across
// processes of one host; none in one process.
type linkTargets struct {
	prefix      string
	read, send  goal // at most
	write, rdBW goal // at least
}

// goal is a target (limit 0: none). A soft goal that is missed is named in
// its check, not enforced by -check: issue 16's targets that runs on the
// shared two-core machine do not meet yet.
type goal struct {
	limit float64
	soft  bool
}

func firm(limit float64) goal  { return goal{limit: limit} }
func loose(limit float64) goal { return goal{limit: limit, soft: true} }

// On the shared-memory link the 64 KiB WRITE and READ stream targets are
// enforced; the 8 B READ and SEND round trips meet theirs only while both
// processes keep a core, which a loaded two-core machine does not give
// them (MEASUREMENTS.md, "Same-host shared-memory link").
var placeTargets = map[string]linkTargets{
	placementCross: {prefix: "", read: loose(targetShmReadVsTCP), send: loose(targetShmSendVsTCP),
		write: firm(targetShmBWVsTCP), rdBW: firm(targetShmBWVsTCP)},
	placementCrossTCP: {prefix: "tcp-link ", read: firm(targetReadVsTCP), write: firm(targetWriteVsTCP), rdBW: firm(targetReadBWVsTCP)},
	placementInproc:   {prefix: "in-process "},
}

// atMost and atLeast set the goal's target on c if it has one.
func (g goal) atMost(c perf.Check) perf.Check {
	if g.limit <= 0 {
		return c
	}
	return g.judge(c.AtMost(g.limit))
}

func (g goal) atLeast(c perf.Check) perf.Check {
	if g.limit <= 0 {
		return c
	}
	return g.judge(c.AtLeast(g.limit))
}

func (g goal) judge(c perf.Check) perf.Check {
	if g.soft && c.Met != nil && !*c.Met {
		c.Name += fmt.Sprintf(" [issue 16 target %s: missed, not enforced]", c.Target)
		c.Target, c.Met = "", nil
	}
	return c
}

// deriveChecks compares every soft-fabric figure with the TCP baseline of
// the same placement and size, and adds the in-process absolute target.
// The cross-process targets are judged on the interleaved runs when there
// are any (see pair.go), since only they see the same machine as their
// baseline; the plain ratios then come without a target.
func deriveChecks(rep *perf.Report) []perf.Check {
	var out []perf.Check
	for _, place := range []string{placementCross, placementCrossTCP, placementInproc} {
		lt := placeTargets[place]
		prefix := lt.prefix
		pairRead, pairWrite, pairReadBW := false, false, false
		if r := rep.FindAt(place, testPairRead, perf.ModeLat); r != nil {
			t, rd := r.LabelRow(seriesTCP), r.LabelRow(testRead)
			if t != nil && rd != nil {
				c := perf.RatioOf(fmt.Sprintf("%sread %s t_typical / tcp %s RTT t_typical (interleaved)", prefix, perf.SizeName(pairLatSize), perf.SizeName(pairLatSize)), rd.Typical, t.Typical)
				out = append(out, lt.read.atMost(c))
				pairRead = true
			}
		}
		if r := rep.FindAt(place, testPairWrite, perf.ModeBW); r != nil {
			t, w := r.BandwidthLabelRow(seriesTCP), r.BandwidthLabelRow(testWrite)
			if t != nil && w != nil {
				c := perf.RatioOf(fmt.Sprintf("%swrite %s BW average / tcp %s stream BW average (interleaved)", prefix, perf.SizeName(pairBWSize), perf.SizeName(pairBWSize)), w.AvgMBps, t.AvgMBps)
				out = append(out, lt.write.atLeast(c))
				pairWrite = true
			}
			if rd := r.BandwidthLabelRow(testRead); t != nil && rd != nil {
				c := perf.RatioOf(fmt.Sprintf("%sread %s BW average / tcp %s stream BW average (interleaved)", prefix, perf.SizeName(pairBWSize), perf.SizeName(pairBWSize)), rd.AvgMBps, t.AvgMBps)
				out = append(out, lt.rdBW.atLeast(c))
				pairReadBW = true
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
					sz := perf.SizeName(row.Bytes)
					name := fmt.Sprintf("%s%s %s t_typical / tcp %s RTT t_typical", prefix, test, sz, sz)
					num := row.Typical
					if test == testSend {
						// The table holds half round trips; compare round trips.
						name = fmt.Sprintf("%ssend %s ping-pong RTT / tcp %s RTT t_typical", prefix, sz, sz)
						num *= 2
					}
					c := perf.RatioOf(name, num, base.Typical)
					switch {
					case test == testRead && row.Bytes == pairLatSize && !pairRead:
						c = lt.read.atMost(c)
					case test == testSend && row.Bytes == pairLatSize:
						c = lt.send.atMost(c)
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
					sz := perf.SizeName(row.Bytes)
					c := perf.RatioOf(fmt.Sprintf("%s%s %s BW average / tcp %s stream BW average", prefix, test, sz, sz), row.AvgMBps, base.AvgMBps)
					if row.Bytes == pairBWSize {
						if test == testWrite && !pairWrite {
							c = lt.write.atLeast(c)
						}
						if test == testRead && !pairReadBW {
							c = lt.rdBW.atLeast(c)
						}
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
	return append(out, deriveKrChecks(rep)...)
}

// deriveKrChecks derives the KRCore runtime's figures and targets, each
// from tables of one run (the connect series, VQ and QP series are
// interleaved within their tables).
func deriveKrChecks(rep *perf.Report) []perf.Check {
	var out []perf.Check
	for _, place := range []string{placementCross, placementInproc} {
		prefix := place + " "
		if r := rep.FindAt(place, testKrConnect, perf.ModeLat); r != nil {
			cold, warm, mr, rd := r.LabelRow(seriesCold), r.LabelRow(seriesWarm), r.LabelRow(seriesMetaRead), r.LabelRow(seriesRead8)
			if dw := r.LabelRow(seriesWarm + daemonSuffix); dw != nil {
				// Through krcored: its own target, and ratios without the
				// embedded runtime's.
				out = append(out, daemonConnectChecks(rep, place, dw)...)
			}
			if warm != nil {
				out = append(out, perf.Figure(prefix+"krcore warm connect t_typical", warm.Typical, "usec").Below(targetWarmConnectUsec))
			}
			if cold != nil {
				out = append(out, perf.Figure(prefix+"krcore cold connect t_typical", cold.Typical, "usec"))
			}
			if cold != nil && rd != nil {
				c := perf.RatioOf(prefix+"krcore cold connect / 8B READ to the MetaServer node t_typical (interleaved)", cold.Typical, rd.Typical)
				if place == placementCross {
					// In one process a READ is a function call, so any
					// bookkeeping at all is a large multiple of it; the
					// target is about the fabric round trip.
					c = c.AtMost(targetColdVsRead)
				}
				out = append(out, c)
			}
			if cold != nil && mr != nil {
				out = append(out, perf.RatioOf(prefix+"krcore cold connect / MetaServer lookup (meta.Client.Fetch) t_typical (interleaved)", cold.Typical, mr.Typical))
			}
			if conn := rep.FindAt(place, testConnect, perf.ModeLat); conn != nil && warm != nil {
				if total := conn.LabelRow("total"); total != nil {
					c := perf.RatioOf(prefix+"raw RC connect total / krcore warm connect t_typical", total.Typical, warm.Typical)
					if place == placementCross {
						c = c.AtLeast(targetRCVsWarm)
					}
					out = append(out, c)
					if cold != nil {
						out = append(out, perf.RatioOf(prefix+"raw RC connect total / krcore cold connect t_typical", total.Typical, cold.Typical))
					}
				}
			}
		}
		if r := rep.FindAt(place, testKrRate, perf.ModeBW); r != nil {
			// Judged on the median blocks: one stall of a shared machine
			// must not decide a rate.
			for _, row := range r.Bandwidth {
				g, ok := strings.CutSuffix(row.Label, medianSuffix)
				if !ok {
					continue
				}
				g, daemon := strings.CutSuffix(g, daemonSuffix)
				how := ""
				if daemon {
					how = " through krcored"
				}
				c := perf.Figure(fmt.Sprintf("%skrcore warm connects/s%s, %s goroutine(s), median block", prefix, how, g), row.MsgRate, "M/s")
				if g == "1" && !daemon {
					c = c.AtLeast(targetWarmConnectMps)
				}
				out = append(out, c)
			}
		}
		for _, t := range []struct{ test, name string }{
			{testVQRead, "VQ 8B READ"}, {testVQWrite, "VQ 8B WRITE"}, {testVQSend, "VQ 64B SEND RTT"},
		} {
			if r := rep.FindAt(place, t.test, perf.ModeLat); r != nil {
				if vq, qp := r.LabelRow(seriesVQ), r.LabelRow(seriesQP); vq != nil && qp != nil {
					c := perf.RatioOf(fmt.Sprintf("%s%s t_typical / raw QP t_typical (interleaved)", prefix, t.name), vq.Typical, qp.Typical)
					switch {
					case place == placementInproc && t.test == testVQRead:
						c = loose(targetVQVsQPReadInproc).atMost(c)
					case place == placementInproc && t.test == testVQSend:
						c = loose(targetVQSendInproc).atMost(c)
					case t.test == testVQRead:
						c = c.AtMost(targetVQVsQPRead)
					}
					out = append(out, c)
				}
				// Through krcored the ratio has no target: the daemon's
				// is against the embedded runtime (krbench daemon).
				if vq, qp := r.LabelRow(seriesVQ+daemonSuffix), r.LabelRow(seriesQP); vq != nil && qp != nil {
					out = append(out, perf.RatioOf(fmt.Sprintf("%s%s through krcored t_typical / raw QP t_typical (interleaved)", prefix, t.name), vq.Typical, qp.Typical))
				}
			}
			if r := rep.FindAt(place, t.test, perf.ModeBW); r != nil {
				qp := r.BandwidthLabelRow(seriesQP + medianSuffix)
				for _, via := range []struct{ suffix, name string }{{"", ""}, {daemonSuffix, " through krcored"}} {
					if vq := r.BandwidthLabelRow(seriesVQ + via.suffix + medianSuffix); vq != nil && qp != nil {
						c := perf.RatioOf(fmt.Sprintf("%s%s%s MsgRate / raw QP MsgRate (median blocks, interleaved)",
							prefix, t.name, via.name), vq.MsgRate, qp.MsgRate)
						if place == placementInproc && t.test == testVQRead && via.suffix == "" {
							c = loose(targetVQReadRateInproc).atLeast(c)
						}
						out = append(out, c)
					}
				}
			}
		}
	}
	if r := rep.FindAt(placementInproc, testMesh, perf.ModeLat); r != nil {
		kr, rc := r.LabelRow(seriesKrcore), r.LabelRow(seriesRC)
		if kr != nil && rc != nil {
			nodes := strings.TrimSuffix(strings.TrimPrefix(r.Title, "Full-Mesh Creation Test, "), " (interleaved)")
			out = append(out,
				perf.Figure("in-process full mesh of "+nodes+": krcore t_typical", kr.Typical, "usec"),
				perf.Figure("in-process full mesh of "+nodes+": raw RC t_typical", rc.Typical, "usec"),
				perf.RatioOf("in-process full mesh of "+nodes+": raw RC / krcore t_typical (interleaved)", rc.Typical, kr.Typical))
		}
	}
	if r := rep.FindAt(placementInproc, testCluster, perf.ModeLat); r != nil {
		cold, warm, rc := r.LabelRow(stepCold), r.LabelRow(stepWarm), r.LabelRow(stepRC)
		if cold != nil && warm != nil && rc != nil {
			out = append(out,
				perf.RatioOf("walkthrough: raw RC connect / VQ cold connect t_typical (interleaved)", rc.Typical, cold.Typical),
				perf.RatioOf("walkthrough: raw RC connect / VQ warm connect t_typical (interleaved)", rc.Typical, warm.Typical))
		}
	}
	return out
}

// daemonConnectChecks are the connect table's figures through krcored:
// warm connect latency (the daemon's target) and the raw RC connect and
// MetaServer READ against it.
func daemonConnectChecks(rep *perf.Report, place string, warm *perf.LatencyStats) []perf.Check {
	prefix := place + " "
	out := []perf.Check{perf.Figure(prefix+"krcore warm connect through krcored t_typical", warm.Typical, "usec").Below(targetDaemonConnectUsec)}
	if conn := rep.FindAt(place, testConnect, perf.ModeLat); conn != nil {
		if total := conn.LabelRow("total"); total != nil {
			out = append(out, perf.RatioOf(prefix+"raw RC connect total / krcore warm connect through krcored t_typical", total.Typical, warm.Typical))
		}
	}
	return out
}

// newOutput is a run's report.Output, as cfg asks (-json), deriving every
// test's checks: the suite's and krbench daemon's.
func newOutput(cfg *config, w io.Writer) *report.Output {
	return report.New(w, cfg.json, func(rep *perf.Report) []perf.Check {
		return append(deriveChecks(rep), deriveDaemonChecks(rep)...)
	})
}
