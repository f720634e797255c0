package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/bench/vqrun"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/verbs"
)

// runVQ compares the KRCore data plane with raw verbs between the same two
// soft RNICs, in interleaved blocks: 8 B READ and WRITE one at a time (lat)
// and with a window of requests outstanding (bw) through a VQ and through a
// raw RC QP, and 64 B SEND round trips through VQs (Bind, a Connect to a port, PushRecv,
// PopMsgsWait) and through raw RC SEND/RECV.
func (c *client) runVQ() (err error) {
	cfg := c.cfg
	kr, err := c.startKr()
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, kr.close()) }()
	v := &vqSide{c: c, kr: kr, rt: kr.api, server: kr.server, poll: newVQPoll(cfg, c.place)}
	if err := v.open(); err != nil {
		v.close()
		return c.connectErr(kr, err)
	}
	defer v.close()
	modes := cfg.modesOf(testVQ)
	if slices.Contains(modes, modeLat) {
		if err := v.oneSidedLat(); err != nil {
			return err
		}
		if err := v.twoSidedLat(); err != nil {
			return err
		}
	}
	if slices.Contains(modes, modeBW) {
		if err := v.oneSidedBW(); err != nil {
			return err
		}
	}
	return nil
}

// vqSide is the client's runtime end of the VQ tests: embedded, or
// through krcored.
type vqSide struct {
	c      *client
	kr     *krRuntime
	rt     krcore.API
	server krcore.NodeID
	q      krcore.VQ // connected to the server, one-sided
	region krcore.Region
	local  krcore.MR
	poll   vqrun.Poll // waits as the raw QP's poller does
}

func (v *vqSide) close() error { return vqrun.CloseVQ(v.rt, v.q, v.local) }

func (v *vqSide) open() error {
	ctx, cancel := context.WithTimeout(v.c.ctx, v.c.cfg.timeout)
	defer cancel()
	var err error
	if v.local, err = v.rt.RegMR(4096, verbs.AccessAll); err != nil {
		return err
	}
	if v.region, err = v.rt.Region(ctx, v.server, regionName); err != nil {
		return err
	}
	if v.q, err = v.rt.Queue(); err != nil {
		return err
	}
	return v.q.Connect(ctx, v.server, nil)
}

// request is the VQ request of a one-sided op of size bytes.
func (v *vqSide) request(op verbs.Opcode, size int) krcore.Request {
	return krcore.Request{Op: op, Local: v.local.Range(0, size), Remote: v.region.At(0)}
}

// info is the preamble every VQ-vs-QP table shares.
func (v *vqSide) info(series string) []perf.Field {
	st := v.rt.Stats()
	route := "DC (the runtime's DCI pool)"
	switch {
	case st.RCOnly:
		route = fmt.Sprintf("RC, RC-only mode (no DC on the device): %d RC QP(s) built", st.RCBuilt)
	case st.RCs > 0:
		route = fmt.Sprintf("RC: the runtime built %d RC QP(s) to the hot peer and moved the VQ (%d migrations)", st.RCBuilt, st.Migrations)
	}
	return []perf.Field{
		{Key: "Series", Value: series},
		{Key: "VQ", Value: fmt.Sprintf("client %s -> server node %d; route at the end: %s", v.c.where(v.kr), v.server, route)},
		{Key: "QP", Value: "a raw RC QP between the same two RNICs, its own PD/CQ, no inline data (as the VQ)"},
		{Key: "Fabric", Value: v.c.fabricIn},
		{Key: "CQ polling", Value: "qp: " + v.c.polling() + "; vq: " + v.poll.String()},
		{Key: "Blocks", Value: fmt.Sprintf("%d per series, alternating (ABBA)", interleave.Blocks)},
	}
}

// vqOneSidedOp is a one-sided op the VQ is compared on, with its tables'
// titles.
type vqOneSidedOp struct {
	test, latTitle, bwTitle string
	op                      verbs.Opcode
}

var vqOneSidedOps = []vqOneSidedOp{
	{testVQRead, "VQ vs QP RDMA_Read Latency, 8 B (interleaved)", "VQ vs QP RDMA_Read BW, 8 B (interleaved)", verbs.OpRead},
	{testVQWrite, "VQ vs QP RDMA_Write Latency, 8 B (interleaved)", "VQ vs QP RDMA_Write BW, 8 B (interleaved)", verbs.OpWrite},
}

// oneSided runs each of vqOneSidedOps in mode through the VQ and a raw RC
// QP between the same RNICs; one endpoint and deadline serve both ops.
func (v *vqSide) oneSided(mode string, each func(r *rdmaRun, dl *rawqp.Deadline, t vqOneSidedOp) error) (err error) {
	c := v.c
	r, err := c.openRun(testRead, mode, vqOneSidedSize, 0)
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, c.closeRun(r)) }()
	dl := rawqp.NewDeadline(c.ctx, c.cfg.timeout)
	defer dl.Close()
	for _, t := range vqOneSidedOps {
		if err := each(r, dl, t); err != nil {
			return err
		}
	}
	return nil
}

// oneSidedLat: sync 8 B READ and WRITE, VQ vs QP.
func (v *vqSide) oneSidedLat() error { return v.oneSided(modeLat, v.oneSidedLatOp) }

func (v *vqSide) oneSidedLatOp(r *rdmaRun, dl *rawqp.Deadline, t vqOneSidedOp) error {
	c, cfg := v.c, v.c.cfg
	spec := rawqp.Spec{Op: t.op, Size: vqOneSidedSize, Remote: r.mr}
	req := v.request(t.op, vqOneSidedSize)
	vq := &interleave.Latency{Run: func(warmup, iters int) ([]time.Duration, error) {
		return vqrun.Latency(dl, v.q, v.poll, req, warmup, iters)
	}}
	qp := &interleave.Latency{Run: func(warmup, iters int) ([]time.Duration, error) { return r.ep.Latency(r.p, spec, warmup, iters) }}
	iters, warmup := cfg.iters(modeLat, vqOneSidedSize)
	per := interleave.PerBlock(iters)
	if err := interleave.WarmLatency(warmup, vq, qp); err != nil {
		return err
	}
	c.logf("%s: %d blocks of %d", t.test, interleave.Blocks, per)
	if err := interleave.Pair(vq.Block(per), qp.Block(per)); err != nil {
		return fmt.Errorf("%s: %w", t.test, err)
	}
	a, b := perf.Latency(vqOneSidedSize, vq.Samples), perf.Latency(vqOneSidedSize, qp.Samples)
	a.Label, b.Label = c.label(seriesVQ), seriesQP
	return c.out.Add(perf.Result{Title: c.krTitle(t.latTitle), Test: t.test, Mode: perf.ModeLat, Column: "series", Placement: c.place,
		Info:    v.info("vq: Queue.Push, then wait for its completion, one request at a time; qp: post one signaled WR, poll its completion"),
		Latency: []perf.LatencyStats{a, b}})
}

// twoSidedLat: 64 B round trips, VQ ping-pong vs raw RC SEND/RECV
// ping-pong; the server echoes both.
func (v *vqSide) twoSidedLat() (err error) {
	c, cfg := v.c, v.c.cfg
	size := vqTwoSidedSize
	r, err := c.openRun(testSend, modeLat, size, 0)
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, c.closeRun(r)) }()
	ping, err := vqrun.NewPing(c.ctx, v.rt, clientPort, v.server, echoPort, v.poll)
	if err != nil {
		return err
	}
	defer ping.Close()
	iters, warmup := cfg.iters(modeLat, size)
	per := interleave.PerBlock(iters)
	var vq, qp []time.Duration
	vqBlock := func(n int, keep bool) error {
		if err := c.ctl.Send(&control.Msg{Op: control.OpRun, Test: runVQEcho, Size: size, Total: n}, cfg.timeout); err != nil {
			return err
		}
		s, err := ping.Run(c.ctx, size, 0, n, cfg.timeout)
		if err != nil {
			return err
		}
		if _, err := c.ctl.Reply(control.OpRun, cfg.timeout); err != nil {
			return fmt.Errorf("VQ echo: %w", err)
		}
		if keep {
			vq = append(vq, s...)
		}
		return nil
	}
	qpBlock := func(n int, keep bool) error {
		if err := c.ctl.Send(&control.Msg{Op: control.OpRun, Test: testSend, Mode: modeLat, Size: size, Total: n}, cfg.timeout); err != nil {
			return err
		}
		s, err := r.ep.PingPong(r.p, size, 0, n)
		if err != nil {
			return fmt.Errorf("RC ping-pong: %w", err)
		}
		if _, err := c.ctl.Reply(control.OpRun, cfg.timeout); err != nil {
			return fmt.Errorf("RC echo: %w", err)
		}
		if keep {
			qp = append(qp, s...)
		}
		return nil
	}
	if err := vqBlock(warmup, false); err != nil {
		return err
	}
	if err := qpBlock(warmup, false); err != nil {
		return err
	}
	c.logf("%s: %d blocks of %d round trips", testVQSend, interleave.Blocks, per)
	if err := interleave.Pair(func() error { return vqBlock(per, true) }, func() error { return qpBlock(per, true) }); err != nil {
		return fmt.Errorf("%s: %w", testVQSend, err)
	}
	a, b := perf.Latency(size, vq), perf.Latency(size, qp)
	a.Label, b.Label = c.label(seriesVQ), seriesQP
	return c.out.Add(perf.Result{Title: c.krTitle("VQ vs RC Send ping-pong round trip, 64 B (interleaved)"), Test: testVQSend, Mode: perf.ModeLat,
		Column: "series", Placement: c.place,
		Info: append(v.info("full round trips (not halved): vq: SEND to the server's bound port, its VQ echoes to the port ours is bound to; "+
			"qp: SEND on a raw RC QP, the server's RC QP echoes"),
			perf.Field{Key: "RX depth", Value: fmt.Sprintf("vq: %d buffers per port; qp: %d receives", vqrun.EchoSlots, cfg.rxDepth)}),
		Latency: []perf.LatencyStats{a, b}})
}

// oneSidedBW: 8 B READ and WRITE with a window of -tx-depth requests
// outstanding, one in -cq-mod signaled, VQ vs QP.
func (v *vqSide) oneSidedBW() error { return v.oneSided(modeBW, v.oneSidedBWOp) }

func (v *vqSide) oneSidedBWOp(r *rdmaRun, dl *rawqp.Deadline, t vqOneSidedOp) error {
	c, cfg := v.c, v.c.cfg
	spec := rawqp.Spec{Op: t.op, Size: vqOneSidedSize, Remote: r.mr}
	req := v.request(t.op, vqOneSidedSize)
	vq := interleave.NewBandwidth(func(total int) ([]perf.Mark, error) {
		return vqrun.Stream(dl, v.q, v.poll, req, total, cfg.txDepth, cfg.cqMod)
	})
	qp := interleave.NewBandwidth(func(total int) ([]perf.Mark, error) { return r.ep.Stream(r.p, spec, total, cfg.txDepth, cfg.cqMod) })
	iters, warmup := cfg.iters(modeBW, vqOneSidedSize)
	per := interleave.PerBlock(iters)
	if err := interleave.WarmBandwidth(warmup, vq, qp); err != nil {
		return err
	}
	c.logf("%s bw: %d blocks of %d", t.test, interleave.Blocks, per)
	if err := interleave.Pair(vq.Block(per), qp.Block(per)); err != nil {
		return fmt.Errorf("%s bw: %w", t.test, err)
	}
	a, b := perf.Bandwidth(vqOneSidedSize, vq.Marks, cfg.txDepth), perf.Bandwidth(vqOneSidedSize, qp.Marks, cfg.txDepth)
	ma, mb := perf.MedianBlock(vqOneSidedSize, vq.BlockMarks, cfg.txDepth), perf.MedianBlock(vqOneSidedSize, qp.BlockMarks, cfg.txDepth)
	a.Label, b.Label, ma.Label, mb.Label = c.label(seriesVQ), seriesQP, c.label(seriesVQ)+medianSuffix, seriesQP+medianSuffix
	return c.out.Add(perf.Result{Title: c.krTitle(t.bwTitle), Test: t.test, Mode: perf.ModeBW, Column: "series", Placement: c.place,
		Info: append(v.info("vq: Queue.Push, one request in cq-mod signaled, wait for completions; qp: the same with WRs on the raw QP"),
			perf.Field{Key: "TX depth", Value: strconv.Itoa(cfg.txDepth)},
			perf.Field{Key: "CQ moderation", Value: strconv.Itoa(cfg.cqMod)},
			perf.Field{Key: "Rows", Value: "vq, qp: the whole series; *" + medianSuffix + ": its block with the median rate (one scheduler stall cannot move it)"}),
		Bandwidth: []perf.BandwidthStats{a, b, ma, mb}})
}

func newVQPoll(cfg *config, placement string) vqrun.Poll {
	return vqrun.Poll{Spin: cfg.spinFor(placement), Yield: placement == placementInproc}
}
