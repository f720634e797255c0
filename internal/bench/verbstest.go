package bench

import (
	"fmt"
	"time"

	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/verbs"
)

// setup creates this side's endpoint for a test, inline payloads up to
// inline bytes, has the server create its own, and connects both: the
// out-of-band exchange perftest does. It returns the server's MR.
// shared puts the server's MR in a memfd (in place on the shm link).
func (c *client) setup(test, mode string, size, inline int, shared bool) (_ *rawqp.Endpoint, _ control.MR, err error) {
	cfg := c.cfg
	fail := func(err error) (*rawqp.Endpoint, control.MR, error) {
		return nil, control.MR{}, fmt.Errorf("%s %s setup: %w", test, mode, err)
	}
	sh := rawqp.Shape{SendDepth: cfg.txDepth, RecvDepth: 1, Inline: inline}
	if test == testSend {
		sh.RecvDepth = cfg.rxDepth
	}
	ep, err := rawqp.NewEndpoint(c.dev, nil, size, sh)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err != nil {
			ep.Close()
		}
	}()
	b, err := control.MarshalEP(ep.QP)
	if err != nil {
		return fail(err)
	}
	rep, err := c.ctl.Call(&control.Msg{Op: control.OpSetup, Test: test, Mode: mode, MaxSize: size,
		TxDepth: cfg.txDepth, RxDepth: cfg.rxDepth, Inline: ep.Inline, Shared: shared, EP: b}, cfg.timeout)
	if err != nil {
		return fail(err)
	}
	remote, err := control.UnmarshalEP(rep.EP)
	if err != nil {
		return fail(err)
	}
	if rep.MR == nil || rep.MR.Len < size {
		return fail(fmt.Errorf("server MR missing or smaller than %d B", size))
	}
	if err := ep.Connect(remote); err != nil {
		return fail(err)
	}
	if test == testSend && mode == modeLat {
		// Echoes come back as SENDs; the server sends none before our
		// first SEND, so posting after connecting is in time.
		if err := ep.PostRecvs(cfg.rxDepth); err != nil {
			return fail(err)
		}
	}
	return ep, *rep.MR, nil
}

// teardown frees both sides' objects of a test.
func (c *client) teardown(ep *rawqp.Endpoint) error {
	_, err := c.ctl.Call(&control.Msg{Op: control.OpTeardown}, c.cfg.timeout)
	return firstErr(err, ep.Close())
}

// rdmaRun is a test's connected endpoint, the server's MR it targets and
// a poller on the endpoint's CQ: what every measured RDMA series needs.
type rdmaRun struct {
	ep *rawqp.Endpoint
	mr control.MR
	p  *rawqp.Poller
}

// openRun is setup plus the poller the client's placement calls for. The
// server's MR is private memory, as a KRCore runtime's is, so that a raw
// QP compared with a VQ takes the same path.
func (c *client) openRun(test, mode string, size, inline int) (*rdmaRun, error) {
	return c.openRunMem(test, mode, size, inline, false)
}

// openRunMem is openRun with the server's MR in a memfd if shared: what
// the perftest-style tests use, so that on the shared-memory link their
// READs and WRITEs go in place.
func (c *client) openRunMem(test, mode string, size, inline int, shared bool) (*rdmaRun, error) {
	ep, mr, err := c.setup(test, mode, size, inline, shared)
	if err != nil {
		return nil, err
	}
	p := rawqp.NewPoller(c.ctx, ep.CQ, c.cfg.spinFor(c.place), c.cfg.timeout, c.place == placementInproc)
	return &rdmaRun{ep: ep, mr: mr, p: p}, nil
}

// closeRun stops the poller before both sides' objects go away.
func (c *client) closeRun(r *rdmaRun) error {
	r.p.Close()
	return c.teardown(r.ep)
}

// fitSizes drops sizes the device cannot carry in one message.
func (c *client) fitSizes(test, mode string) []int {
	limit := int(min(uint64(c.dev.Attr().MaxMsgSize), c.dev.Attr().MaxMRSize))
	var out []int
	for _, s := range c.cfg.sizes(test, mode) {
		if s <= limit {
			out = append(out, s)
		} else {
			c.logf("%s %s: skipping %d B, above the device's %d B message limit", test, mode, s, limit)
		}
	}
	return out
}

func opcode(test, atomicOp string) verbs.Opcode {
	switch test {
	case testRead:
		return verbs.OpRead
	case testWrite:
		return verbs.OpWrite
	case testSend:
		return verbs.OpSend
	}
	if atomicOp == "cas" {
		return verbs.OpCompareSwap
	}
	return verbs.OpFetchAdd
}

// latencyRun measures one size. SEND is a ping-pong with the server
// echoing; its samples are halved, as ib_send_lat reports half the round
// trip.
func (c *client) latencyRun(ep *rawqp.Endpoint, p *rawqp.Poller, test string, spec rawqp.Spec, warmup, iters int) ([]time.Duration, error) {
	if test != testSend {
		s, err := ep.Latency(p, spec, warmup, iters)
		if err != nil {
			return nil, fmt.Errorf("%s lat: %w", test, err)
		}
		return s, nil
	}
	if err := c.ctl.Send(&control.Msg{Op: control.OpRun, Test: test, Mode: modeLat, Size: spec.Size, Total: warmup + iters}, c.cfg.timeout); err != nil {
		return nil, err
	}
	samples, err := ep.PingPong(p, spec.Size, warmup, iters)
	if err != nil {
		return nil, fmt.Errorf("send lat: %w", err)
	}
	if _, err := c.ctl.Reply(control.OpRun, c.cfg.timeout); err != nil {
		return nil, fmt.Errorf("send lat: %w", err)
	}
	for i := range samples {
		samples[i] /= 2
	}
	return samples, nil
}

// bandwidthRun measures one size after a one-window warm-up. For SEND the
// server counts warm-up and measured receives.
func (c *client) bandwidthRun(ep *rawqp.Endpoint, p *rawqp.Poller, test string, spec rawqp.Spec, warmup, iters int) ([]perf.Mark, error) {
	cfg := c.cfg
	if test == testSend {
		if err := c.ctl.Send(&control.Msg{Op: control.OpRun, Test: test, Mode: modeBW, Size: spec.Size, Total: warmup + iters}, cfg.timeout); err != nil {
			return nil, err
		}
	}
	if warmup > 0 {
		if _, err := ep.Stream(p, spec, warmup, cfg.txDepth, cfg.cqMod); err != nil {
			return nil, fmt.Errorf("%s bw warm-up: %w", test, err)
		}
	}
	marks, err := ep.Stream(p, spec, iters, cfg.txDepth, cfg.cqMod)
	if err != nil {
		return nil, fmt.Errorf("%s bw: %w", test, err)
	}
	if test == testSend {
		if _, err := c.ctl.Reply(control.OpRun, cfg.timeout); err != nil {
			return nil, fmt.Errorf("send bw: %w", err)
		}
	}
	return marks, nil
}
