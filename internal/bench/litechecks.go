package bench

import (
	"fmt"

	"github.com/krcore/krcore/internal/perf"
)

// deriveLiteChecks derives krbench lite's ratios and targets, each from
// one table's interleaved series.
func deriveLiteChecks(rep *perf.Report) []perf.Check {
	var out []perf.Check
	for _, place := range []string{placementInproc, placementCross} {
		r := rep.FindAt(place, testLiteRead, perf.ModeLat)
		if r == nil {
			continue
		}
		for _, via := range []struct{ suffix, name string }{{"", "embedded"}, {daemonSuffix, "through krcored"}} {
			lmr, vq := r.LabelRow(seriesLMR+via.suffix), r.LabelRow(seriesVQ+via.suffix)
			if lmr == nil || vq == nil {
				continue
			}
			out = append(out, perf.RatioOf(fmt.Sprintf("%s %s: lite LMR 8B Read t_typical / VQ 8B READ t_typical (interleaved)", place, via.name),
				lmr.Typical, vq.Typical).AtMost(targetLMRVsVQRead))
		}
	}
	for _, place := range []string{placementInproc, placementCross} {
		out = append(out, liteRPCChecks(rep, place)...)
		r := rep.FindAt(place, testLiteMemcpy, perf.ModeLat)
		if r == nil {
			continue
		}
		for _, via := range []struct{ suffix, name string }{{"", "embedded"}, {daemonSuffix, "through krcored"}} {
			mc, rw := r.LabelRow(seriesMemcpy+via.suffix), r.LabelRow(seriesReadWrite+via.suffix)
			if mc != nil && rw != nil {
				out = append(out, perf.RatioOf(fmt.Sprintf("%s %s: lite Memcpy 1MiB at the master t_typical / Read+Write through the caller t_typical (interleaved)", place, via.name),
					mc.Typical, rw.Typical))
			}
		}
	}
	return out
}

// liteRPCChecks are the lite-rpc table's ratios at place: a call against a
// raw-QP SEND round trip between the same nodes (embedded: the target), a
// VQ SEND round trip each way (through krcored: the target, since no raw
// QP reaches krcored's RNIC), and Go net/rpc (the embedded call's target:
// net/rpc does not go through krcored).
func liteRPCChecks(rep *perf.Report, place string) []perf.Check {
	r := rep.FindAt(place, testLiteRPC, perf.ModeLat)
	if r == nil {
		return nil
	}
	var out []perf.Check
	netRPC, raw := r.LabelRow(seriesNetRPC), r.LabelRow(seriesQPSendRT)
	for _, via := range []struct{ suffix, name string }{{"", "embedded"}, {daemonSuffix, "through krcored"}} {
		call, send := r.LabelRow(seriesLiteRPC+via.suffix), r.LabelRow(seriesVQSendRT+via.suffix)
		if call == nil {
			continue
		}
		if raw != nil && via.suffix == "" {
			out = append(out, perf.RatioOf(fmt.Sprintf("%s %s: lite RPC 8B round trip t_typical / raw-QP SEND round trip t_typical (interleaved)", place, via.name),
				call.Typical, raw.Typical).AtMost(targetRPCVsSend))
		}
		if send != nil {
			c := perf.RatioOf(fmt.Sprintf("%s %s: lite RPC 8B round trip t_typical / VQ SEND round trip t_typical (interleaved)", place, via.name),
				call.Typical, send.Typical)
			if via.suffix != "" {
				c = c.AtMost(targetRPCVsSend)
			}
			out = append(out, c)
		}
		if netRPC != nil {
			c := perf.RatioOf(fmt.Sprintf("%s %s: lite RPC 8B round trip t_typical / Go net/rpc over TCP t_typical (interleaved)", place, via.name),
				call.Typical, netRPC.Typical)
			if via.suffix == "" {
				c = c.AtMost(targetRPCVsNetRPC)
			}
			out = append(out, c)
		}
	}
	return out
}
