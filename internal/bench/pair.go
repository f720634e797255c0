package bench

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/verbs"
)

// Interleaved comparisons against the TCP baseline: the project's targets
// are checked on runs that alternate blocks of the TCP baseline and the
// soft fabric (ABBA order, package interleave says why), both seeing the
// same noise; the separate tables stay for perftest-shaped detail.

// Test names of the interleaved results and their series labels.
const (
	testPairRead  = "interleaved-read"
	testPairWrite = "interleaved-write"
	seriesTCP     = "tcp"
)

// pairSizes are the sizes the targets name.
const (
	pairLatSize = 8
	pairBWSize  = 64 << 10
)

// runPaired runs the interleaved comparisons the selected tests allow.
func (c *client) runPaired() error {
	has := slices.Contains[[]string]
	if has(c.cfg.modesOf(testRead), modeLat) {
		if err := c.pairLatency(); err != nil {
			return fmt.Errorf("interleaved read/tcp: %w", err)
		}
	}
	if has(c.cfg.modesOf(testWrite), modeBW) {
		if err := c.pairBandwidth(); err != nil {
			return fmt.Errorf("interleaved write/tcp: %w", err)
		}
	}
	return nil
}

// openPair opens both sides of an interleaved comparison: the TCP
// baseline and an RDMA endpoint for test. done closes both.
func (c *client) openPair(test, mode string, size int) (rc *rawClient, r *rdmaRun, done func() error, err error) {
	rc, rawDone, err := c.openRaw()
	if err != nil {
		return nil, nil, nil, err
	}
	if r, err = c.openRun(test, mode, size, c.cfg.inlineMax()); err != nil {
		rawDone()
		return nil, nil, nil, err
	}
	done = func() error { return firstErr(c.closeRun(r), rawDone()) }
	return rc, r, done, nil
}

// pairLatency alternates 8 B TCP ping-pongs with 8 B RDMA READs.
func (c *client) pairLatency() (err error) {
	cfg := c.cfg
	rc, r, done, err := c.openPair(testRead, modeLat, pairLatSize)
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, done()) }()
	spec := rawqp.Spec{Op: verbs.OpRead, Size: pairLatSize, Remote: r.mr}
	tcp := &interleave.Latency{Run: func(warmup, iters int) ([]time.Duration, error) { return rc.pingPong(pairLatSize, warmup, iters) }}
	rd := &interleave.Latency{Run: func(warmup, iters int) ([]time.Duration, error) { return r.ep.Latency(r.p, spec, warmup, iters) }}

	iters, warmup := cfg.iters(modeLat, pairLatSize)
	per := interleave.PerBlock(iters)
	if err := interleave.WarmLatency(warmup, tcp, rd); err != nil {
		return err
	}
	c.logf("interleaved: %d blocks of %d TCP ping-pongs and %d READs of %d B", interleave.Blocks, per, per, pairLatSize)
	if err := interleave.Pair(tcp.Block(per), rd.Block(per)); err != nil {
		return err
	}
	t, l := perf.Latency(pairLatSize, tcp.Samples), perf.Latency(pairLatSize, rd.Samples)
	t.Label, l.Label = seriesTCP, testRead
	return c.out.Add(perf.Result{
		Title: "Interleaved RDMA_Read vs TCP ping-pong, " + strconv.Itoa(pairLatSize) + " B", Test: testPairRead,
		Mode: perf.ModeLat, Column: "series", Placement: c.place,
		Info: []perf.Field{
			{Key: "Series", Value: "tcp: full round trip of a Go TCP ping-pong; read: RDMA READ post to completion"},
			{Key: "Blocks", Value: fmt.Sprintf("%d of %d per series, alternating (ABBA)", interleave.Blocks, per)},
			{Key: "Fabric", Value: c.fabricIn},
			{Key: "CQ polling", Value: c.polling()},
		},
		Latency: []perf.LatencyStats{t, l},
	})
}

// pairBandwidth alternates 64 KiB TCP stream blocks with 64 KiB WRITE
// blocks.
func (c *client) pairBandwidth() (err error) {
	cfg := c.cfg
	rc, r, done, err := c.openPair(testWrite, modeBW, pairBWSize)
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, done()) }()
	spec := rawqp.Spec{Op: verbs.OpWrite, Size: pairBWSize, Remote: r.mr}
	tcp := interleave.NewBandwidth(func(total int) ([]perf.Mark, error) { return rc.stream(pairBWSize, total, cfg.cqMod) })
	wr := interleave.NewBandwidth(func(total int) ([]perf.Mark, error) { return r.ep.Stream(r.p, spec, total, cfg.txDepth, cfg.cqMod) })

	iters, warmup := cfg.iters(modeBW, pairBWSize)
	per := interleave.PerBlock(iters)
	if err := interleave.WarmBandwidth(warmup, tcp, wr); err != nil {
		return err
	}
	c.logf("interleaved: %d blocks of %d TCP stream writes and %d RDMA WRITEs of %d B", interleave.Blocks, per, per, pairBWSize)
	if err := interleave.Pair(tcp.Block(per), wr.Block(per)); err != nil {
		return err
	}
	t, w := perf.Bandwidth(pairBWSize, tcp.Marks, cfg.txDepth), perf.Bandwidth(pairBWSize, wr.Marks, cfg.txDepth)
	t.Label, w.Label = seriesTCP, testWrite
	return c.out.Add(perf.Result{
		Title: "Interleaved RDMA_Write vs TCP stream, " + sizeName(pairBWSize), Test: testPairWrite,
		Mode: perf.ModeBW, Column: "series", Placement: c.place,
		Info: []perf.Field{
			{Key: "Series", Value: "tcp: one Go TCP stream, until the receiver has it all; write: RDMA WRITE until the last completion"},
			{Key: "Blocks", Value: fmt.Sprintf("%d of %d x %d B per series, alternating (ABBA)", interleave.Blocks, per, pairBWSize)},
			{Key: "TX depth", Value: strconv.Itoa(cfg.txDepth)},
			{Key: "CQ moderation", Value: strconv.Itoa(cfg.cqMod)},
			{Key: "Fabric", Value: c.fabricIn},
		},
		Bandwidth: []perf.BandwidthStats{t, w},
	})
}
