package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/bench/report"
	"github.com/krcore/krcore/internal/bench/vqrun"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/verbs"
)

// The imm test measures what LITE's RPC and an SMC-style ring pay for a
// notified write: a round trip of WRITE_WITH_IMMs (A writes into B's
// memory, B learns of it and writes back into A's) against a round trip
// of SENDs, on raw RC QPs (real WRITE_WITH_IMM receive completions) and on
// VQs (the runtime's notification, Message.Write), between the two nodes
// of an in-process cluster. The four series run in rotating blocks, so
// every ratio is taken from one run. It runs only when named: krbench
// -inproc imm.
const (
	testImm = "imm"

	seriesQPSend  = "qp_send"
	seriesQPImm   = "qp_write_imm"
	seriesVQSend  = "vq_send"
	seriesVQImm   = "vq_write_imm"
	immPingPort   = 92
	immEchoPort   = 93
	immRegionName = "imm-ring"
	immQPDepth    = 16
)

// immSizes are the payloads compared: a cursor update and a page.
var immSizes = []int{8, 4096}

// runImm runs the imm test.
func runImm(ctx context.Context, cfg *config, out *report.Output, stderr io.Writer, logf func(string, ...any)) (err error) {
	cl, _, err := startCluster(ctx, 2, cfg, stderr)
	if err != nil {
		return err
	}
	defer cl.Close()
	raw, err := newImmRaw(ctx, cl, cfg)
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, raw.close()) }()
	poll := newVQPoll(cfg, placementInproc)
	vq, err := newImmVQs(ctx, cl, cfg, poll)
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, vq.close()) }()
	for _, size := range immSizes {
		if err := immSize(ctx, cfg, raw, vq, size, out, logf); err != nil {
			return fmt.Errorf("%s %d B: %w", testImm, size, err)
		}
	}
	return nil
}

// immSize measures the four series at one size.
func immSize(ctx context.Context, cfg *config, raw *immRaw, vq *immVQs, size int, out *report.Output, logf func(string, ...any)) error {
	series := []*interleave.Latency{
		{Run: func(w, n int) ([]time.Duration, error) { return raw.run(verbs.OpSend, size, w, n) }},
		{Run: func(w, n int) ([]time.Duration, error) { return raw.run(verbs.OpWriteImm, size, w, n) }},
		{Run: func(w, n int) ([]time.Duration, error) { return vq.runSend(ctx, size, w, n) }},
		{Run: func(w, n int) ([]time.Duration, error) { return vq.runImm(ctx, size, w, n) }},
	}
	labels := []string{seriesQPSend, seriesQPImm, seriesVQSend, seriesVQImm}
	iters, warmup := cfg.iters(modeLat, size)
	if err := interleave.WarmLatency(warmup, series...); err != nil {
		return err
	}
	per := interleave.PerBlock(iters)
	logf("%s: %d B, %d blocks of %d round trips per series", testImm, size, interleave.Blocks, per)
	for b := range interleave.Blocks { // rotate the order: each series leads once in four
		for k := range series {
			if err := series[(b+k)%len(series)].Block(per)(); err != nil {
				return fmt.Errorf("%s: %w", labels[(b+k)%len(series)], err)
			}
		}
	}
	rows := make([]perf.LatencyStats, len(series))
	for i, s := range series {
		rows[i] = perf.Latency(size, s.Samples)
		rows[i].Label = labels[i]
	}
	ratio := func(a, b int) string { return fmt.Sprintf("%.2f", rows[a].Typical/rows[b].Typical) }
	return out.Add(perf.Result{Title: fmt.Sprintf("WRITE_WITH_IMM + notification vs SEND round trip, %d B (interleaved)", size),
		Test: testImm, Mode: perf.ModeLat, Column: "series", Placement: placementInproc,
		Info: []perf.Field{
			{Key: "Cluster", Value: "2 nodes (soft RNIC + KRCore runtime each) on one in-memory fabric; node 1 pings, node 2 echoes in a goroutine"},
			{Key: "qp", Value: "raw RC QPs between the two RNICs, no inline data: SEND/RECV, or WRITE_WITH_IMM of the bytes into the peer's MR consuming a posted receive"},
			{Key: "vq", Value: "VQs bound to ports and connected to each other's: SEND to the port, or WRITE_WITH_IMM into the peer's exported region, seen as a Message.Write notification"},
			{Key: "Rows", Value: "whole round trips (not halved), request to the echo's arrival"},
			{Key: "Ratios (t_typical)", Value: fmt.Sprintf("qp write_imm/send %s; vq write_imm/send %s; vq/qp send %s; vq/qp write_imm %s",
				ratio(1, 0), ratio(3, 2), ratio(2, 0), ratio(3, 1))},
			{Key: "Blocks", Value: fmt.Sprintf("%d per series, order rotating", interleave.Blocks)},
		},
		Latency: rows})
}

// immRaw is a raw RC QP pair between the cluster's two RNICs.
type immRaw struct {
	ctx     context.Context
	timeout time.Duration
	a, b    *rawqp.Endpoint
	pa, pb  *rawqp.Poller
}

func newImmRaw(ctx context.Context, cl *cluster.Cluster, cfg *config) (_ *immRaw, err error) {
	r := &immRaw{ctx: ctx, timeout: cfg.timeout}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	sh := rawqp.Shape{SendDepth: immQPDepth, RecvDepth: immQPDepth}
	if r.a, err = rawqp.NewEndpoint(cl.Devices[0], nil, vqrun.MaxMessage, sh); err != nil {
		return nil, err
	}
	if r.b, err = rawqp.NewEndpoint(cl.Devices[1], nil, vqrun.MaxMessage, sh); err != nil {
		return nil, err
	}
	if err = r.a.Connect(r.b.QP.Endpoint()); err != nil {
		return nil, err
	}
	if err = r.b.Connect(r.a.QP.Endpoint()); err != nil {
		return nil, err
	}
	for _, e := range []*rawqp.Endpoint{r.a, r.b} {
		if err = e.PostRecvs(immQPDepth); err != nil {
			return nil, err
		}
	}
	spin := cfg.spinFor(placementInproc)
	r.pa = rawqp.NewPoller(ctx, r.a.CQ, spin, cfg.timeout, true)
	r.pb = rawqp.NewPoller(ctx, r.b.CQ, spin, cfg.timeout, true)
	return r, nil
}

// run does warmup+iters round trips of op (SEND or WRITE_WITH_IMM into
// the other side's MR), the echo in a goroutine it owns.
func (r *immRaw) run(op verbs.Opcode, size, warmup, iters int) ([]time.Duration, error) {
	done := make(chan error, 1)
	go func() { done <- r.b.EchoOp(r.pb, rawqp.Spec{Op: op, Size: size, Remote: *r.a.Remote()}, warmup+iters) }()
	s, err := r.a.PingPongOp(r.pa, rawqp.Spec{Op: op, Size: size, Remote: *r.b.Remote()}, warmup, iters)
	// A failed ping leaves the echo waiting for what never comes: its
	// poller gives up within the timeout.
	return s, firstErr(err, <-done)
}

func (r *immRaw) close() error {
	var err error
	for _, p := range []*rawqp.Poller{r.pa, r.pb} {
		if p != nil {
			p.Close()
		}
	}
	for _, e := range []*rawqp.Endpoint{r.a, r.b} {
		if e != nil {
			err = firstErr(err, e.Close())
		}
	}
	return err
}

// immVQs are the VQ sides: a SEND ping and echo (vqrun.Ping, vqrun.Echo), and a
// WRITE_WITH_IMM ping and echo (vqImm).
type immVQs struct {
	timeout    time.Duration
	ping       *vqrun.Ping
	echo       *vqrun.Echo
	immA, immB *vqImm
}

func newImmVQs(ctx context.Context, cl *cluster.Cluster, cfg *config, poll vqrun.Poll) (_ *immVQs, err error) {
	v := &immVQs{timeout: cfg.timeout}
	defer func() {
		if err != nil {
			v.close()
		}
	}()
	a, b := core.Embed(cl.Node(1)), core.Embed(cl.Node(2))
	cctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if v.echo, err = vqrun.NewEcho(b, immEchoPort, poll); err != nil {
		return nil, err
	}
	if v.ping, err = vqrun.NewPing(cctx, a, immPingPort, 2, immEchoPort, poll); err != nil {
		return nil, err
	}
	if v.immA, err = newVQImm(a, immPingPort+10, poll); err != nil {
		return nil, err
	}
	if v.immB, err = newVQImm(b, immEchoPort+10, poll); err != nil {
		return nil, err
	}
	if err = v.immA.connect(cctx, 2, immEchoPort+10); err != nil {
		return nil, err
	}
	if err = v.immB.connect(cctx, 1, immPingPort+10); err != nil {
		return nil, err
	}
	return v, nil
}

func (v *immVQs) close() error {
	var err error
	if v.ping != nil {
		err = firstErr(err, v.ping.Close())
	}
	if v.echo != nil {
		err = firstErr(err, v.echo.Close())
	}
	for _, s := range []*vqImm{v.immA, v.immB} {
		if s != nil {
			err = firstErr(err, s.close())
		}
	}
	return err
}

// runSend does VQ SEND round trips, the echo in a goroutine it owns.
func (v *immVQs) runSend(ctx context.Context, size, warmup, iters int) ([]time.Duration, error) {
	ectx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- v.echo.Serve(ectx, warmup+iters, v.timeout) }()
	s, err := v.ping.Run(ctx, size, warmup, iters, v.timeout)
	if err != nil {
		stop()
	}
	return s, firstErr(err, <-done)
}

// runImm does VQ WRITE_WITH_IMM round trips, the echo in a goroutine it
// owns.
func (v *immVQs) runImm(ctx context.Context, size, warmup, iters int) ([]time.Duration, error) {
	ectx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- v.immB.echo(ectx, size, warmup+iters, v.timeout) }()
	s, err := v.immA.ping(ctx, size, warmup, iters, v.timeout)
	if err != nil {
		stop()
	}
	return s, firstErr(err, <-done)
}

// vqImm is one end of a VQ WRITE_WITH_IMM ping-pong: a VQ bound to a port,
// a region it exports for the peer to write into, and a buffer it writes
// from into the peer's region.
type vqImm struct {
	rt   krcore.API
	poll vqrun.Poll
	q    krcore.VQ
	ring krcore.MR // exported as immRegionName
	src  krcore.MR
	peer krcore.Region
	msgs []krcore.Message
	comp []krcore.Completion
	seq  uint32
}

func newVQImm(rt krcore.API, port uint32, poll vqrun.Poll) (_ *vqImm, err error) {
	v := &vqImm{rt: rt, poll: poll, msgs: make([]krcore.Message, 1), comp: make([]krcore.Completion, 1)}
	defer func() {
		if err != nil {
			v.close()
			err = fmt.Errorf("VQ WRITE_WITH_IMM end on port %d: %w", port, err)
		}
	}()
	if v.q, err = rt.Queue(); err != nil {
		return nil, err
	}
	if err = v.q.Bind(port); err != nil {
		return nil, err
	}
	if v.ring, err = rt.RegMR(vqrun.MaxMessage, verbs.AccessAll); err != nil {
		return nil, err
	}
	if err = rt.Export(immRegionName, v.ring, 0, vqrun.MaxMessage, verbs.AccessRemoteWrite); err != nil {
		return nil, err
	}
	if v.src, err = rt.RegMR(vqrun.MaxMessage, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	return v, nil
}

// connect points the VQ at the peer's port and learns its region.
func (v *vqImm) connect(ctx context.Context, to krcore.NodeID, port uint32) (err error) {
	if err = v.q.Connect(ctx, to, &krcore.ConnectOptions{Port: port}); err != nil {
		return err
	}
	v.peer, err = v.q.Region(ctx, immRegionName)
	return err
}

func (v *vqImm) close() error {
	if v.ring != nil {
		v.rt.Unexport(immRegionName)
	}
	return vqrun.CloseVQ(v.rt, v.q, v.ring, v.src)
}

// write pushes a WRITE_WITH_IMM of size bytes into the peer's region.
func (v *vqImm) write(ctx context.Context, size int, imm uint32) error {
	_, err := v.q.Push(ctx, false, krcore.Request{ID: uint64(imm), Op: verbs.OpWriteImm, Local: v.src.Range(0, size),
		Remote: v.peer.At(0), Imm: imm})
	return err
}

// notified waits for the notification of a WRITE_WITH_IMM of size bytes
// and returns its immediate.
func (v *vqImm) notified(ctx context.Context, size int) (uint32, error) {
	if _, err := v.poll.PopMsgs(ctx, v.q, v.msgs); err != nil {
		return 0, err
	}
	m := v.msgs[0]
	v.msgs[0] = krcore.Message{}
	if !m.Write || m.Status != verbs.Success || m.Len != size {
		return 0, fmt.Errorf("want a notification of %d B, got write=%v len %d status %s", size, m.Write, m.Len, m.Status)
	}
	return m.Imm, nil
}

// completed waits for the completion of the last write.
func (v *vqImm) completed(ctx context.Context) error {
	if _, err := v.poll.Pop(ctx, v.q, v.comp); err != nil {
		return err
	}
	return v.comp[0].Err()
}

// ping does warmup+iters round trips and returns the last iters, write to
// the echo's notification; as vqrun.Ping, it takes its own completion after.
func (v *vqImm) ping(ctx context.Context, size, warmup, iters int, timeout time.Duration) ([]time.Duration, error) {
	dl := rawqp.NewDeadline(ctx, timeout)
	defer dl.Close()
	samples := make([]time.Duration, 0, iters)
	for i := range warmup + iters {
		v.seq++
		wctx := dl.Get()
		t0 := time.Now()
		if err := v.write(wctx, size, v.seq); err != nil {
			return nil, fmt.Errorf("VQ WRITE_WITH_IMM %d B #%d: %w", size, i, err)
		}
		imm, err := v.notified(wctx, size)
		rtt := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("VQ WRITE_WITH_IMM ping-pong %d B #%d: %w", size, i, err)
		}
		if imm != v.seq {
			return nil, fmt.Errorf("VQ WRITE_WITH_IMM ping-pong #%d: echo carries %d, want %d", i, imm, v.seq)
		}
		if err := v.completed(wctx); err != nil {
			return nil, fmt.Errorf("VQ WRITE_WITH_IMM %d B #%d: %w", size, i, err)
		}
		if i >= warmup {
			samples = append(samples, rtt)
		}
	}
	return samples, nil
}

// echo answers total notifications with a WRITE_WITH_IMM of the same size
// and immediate, taking each completion before the next notification, as
// vqrun.Echo does.
func (v *vqImm) echo(ctx context.Context, size, total int, timeout time.Duration) error {
	dl := rawqp.NewDeadline(ctx, timeout)
	defer dl.Close()
	for i := range total {
		wctx := dl.Get()
		imm, err := v.notified(wctx, size)
		if err == nil {
			err = v.write(wctx, size, imm)
		}
		if err == nil {
			err = v.completed(wctx)
		}
		if err != nil {
			return fmt.Errorf("VQ WRITE_WITH_IMM echo #%d of %d: %w", i, total, err)
		}
	}
	return nil
}
