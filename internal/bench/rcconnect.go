package bench

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// runConnect times raw RC connection setup, both sides, as KRCore's paper
// counts it: create PD/CQ/QP/MR, exchange endpoints out of band, RTR/RTS,
// and a first READ that proves the connection works. The server reports how
// long its create and modify took, so the client can split the control
// round trip into the server's work and the exchange itself; the phases add
// up to the total.
func (c *client) runConnect() error {
	cfg := c.cfg
	iters := cfg.n
	if iters <= 0 {
		iters = 100
	}
	// The first connection of a session dials the fabric link between the
	// two nodes (when no earlier test did); it is reported apart from the
	// steady state.
	const warmup = 1
	buf, err := rawqp.AllocBuf(connSize)
	if err != nil {
		return err
	}
	defer buf.Close()
	samples := make([][]time.Duration, len(phases))
	var first time.Duration
	p := rawqp.NewPoller(c.ctx, nil, cfg.spinFor(c.place), cfg.timeout, c.place == placementInproc)
	defer p.Close()
	base := rand.Uint64()
	for i := range warmup + iters {
		c.logf("connect #%d", i)
		ph, err := c.connectOnce(buf, p, base+uint64(i))
		if err != nil {
			return fmt.Errorf("connect #%d: %w", i, err)
		}
		if i < warmup {
			first = ph[len(ph)-1]
			continue
		}
		for k := range ph {
			samples[k] = append(samples[k], ph[k])
		}
	}
	firstWhy := "it dials the fabric link if no earlier test did"
	if c.place == placementIBVerbs {
		firstWhy = "first-touch costs of both processes"
	}
	res := perf.Result{Title: "RC Connect Test", Test: testConnect, Mode: perf.ModeLat, Column: "phase", Placement: c.place,
		Info: []perf.Field{
			{Key: "Transport", Value: c.transport},
			{Key: "Fabric", Value: c.fabricIn},
			{Key: "Phases", Value: "create: PD+CQ+QP+MR both sides; exchange: endpoints over the control connection; modify: INIT/RTR/RTS both sides; first_op: 8 B READ"},
			{Key: "First connect", Value: fmt.Sprintf("%.2f usec total, not in the table (%s)", float64(first)/float64(time.Microsecond), firstWhy)},
		}}
	for k, name := range phases {
		l := perf.Latency(0, samples[k])
		l.Label = name
		res.Latency = append(res.Latency, l)
	}
	return c.out.Add(res)
}

// connectOnce makes, proves and tears down one connection, returning the
// phase durations in phases order.
func (c *client) connectOnce(buf *offheap.Block, p *rawqp.Poller, token uint64) (_ []time.Duration, err error) {
	cfg := c.cfg
	b := buf.Bytes()
	binary.LittleEndian.PutUint64(b, 0)

	t0 := time.Now()
	ep, err := rawqp.NewEndpoint(c.dev, buf, connSize, rawqp.Shape{SendDepth: 4, RecvDepth: 1})
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	defer func() {
		if cerr := ep.Close(); cerr != nil && err == nil {
			err = cerr
		}
		if _, cerr := c.ctl.Call(&control.Msg{Op: control.OpConnClose}, cfg.timeout); cerr != nil && err == nil {
			err = cerr
		}
	}()
	epb, err := control.MarshalEP(ep.QP)
	if err != nil {
		return nil, err
	}
	rep, err := c.ctl.Call(&control.Msg{Op: control.OpConnCreate, EP: epb, Token: token}, cfg.timeout)
	if err != nil {
		return nil, err
	}
	t2 := time.Now()
	remote, err := control.UnmarshalEP(rep.EP)
	if err != nil {
		return nil, err
	}
	if rep.MR == nil {
		return nil, fmt.Errorf("server sent no MR")
	}
	if err := ep.Connect(remote); err != nil {
		return nil, err
	}
	t3 := time.Now()
	p.SetCQ(ep.CQ)
	if _, err := ep.Latency(p, rawqp.Spec{Op: verbs.OpRead, Size: 8, Remote: *rep.MR}, 0, 1); err != nil {
		return nil, fmt.Errorf("first READ: %w", err)
	}
	t4 := time.Now()
	if got := binary.LittleEndian.Uint64(b); got != token {
		return nil, fmt.Errorf("first READ returned %#x, want the server's %#x", got, token)
	}
	serverCreate, serverModify := time.Duration(rep.CreateNS), time.Duration(rep.ModifyNS)
	return []time.Duration{
		t1.Sub(t0) + serverCreate,
		t2.Sub(t1) - serverCreate - serverModify,
		t3.Sub(t2) + serverModify,
		t4.Sub(t3),
		t4.Sub(t0),
	}, nil
}

// Connect-test phases, in order.
var phases = []string{"create", "exchange", "modify", "first_op", "total"}
