package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
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
		if err := c.pairBandwidth(has(c.cfg.modesOf(testRead), modeBW)); err != nil {
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
	if r, err = c.openRunMem(test, mode, size, c.cfg.inlineMax(), true); err != nil {
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
			{Key: "Server MR", Value: serverMR},
			{Key: "CQ polling", Value: c.polling()},
		},
		Latency: []perf.LatencyStats{t, l},
	})
}

// pairBandwidth alternates 64 KiB TCP stream blocks with 64 KiB WRITE
// blocks and, if withRead, 64 KiB READ blocks (rotating the three).
func (c *client) pairBandwidth(withRead bool) (err error) {
	cfg := c.cfg
	rc, r, done, err := c.openPair(testWrite, modeBW, pairBWSize)
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, done()) }()
	stream := func(r *rdmaRun, op verbs.Opcode) *interleave.Bandwidth {
		spec := rawqp.Spec{Op: op, Size: pairBWSize, Remote: r.mr}
		return interleave.NewBandwidth(func(total int) ([]perf.Mark, error) { return r.ep.Stream(r.p, spec, total, cfg.txDepth, cfg.cqMod) })
	}
	series := []*interleave.Bandwidth{
		interleave.NewBandwidth(func(total int) ([]perf.Mark, error) { return rc.stream(pairBWSize, total, cfg.cqMod) }),
		stream(r, verbs.OpWrite),
	}
	labels := []string{seriesTCP, testWrite}
	title := "Interleaved RDMA_Write vs TCP stream, "
	what := "write: RDMA WRITE until the last completion"
	if withRead {
		// The same QP and MRs (registered with every access): the
		// server keeps one endpoint per session.
		series = append(series, stream(r, verbs.OpRead))
		labels = append(labels, testRead)
		title = "Interleaved RDMA_Write and RDMA_Read vs TCP stream, "
		what += "; read: RDMA READ until the last completion"
	}

	iters, warmup := cfg.iters(modeBW, pairBWSize)
	per := interleave.PerBlock(iters)
	if err := interleave.WarmBandwidth(warmup, series...); err != nil {
		return err
	}
	c.logf("interleaved: %d blocks of %d TCP stream writes and %d RDMA %s of %d B", interleave.Blocks, per, per, strings.Join(labels[1:], "s and "), pairBWSize)
	blocks := make([]func() error, len(series))
	for i, s := range series {
		blocks[i] = s.Block(per)
	}
	if err := interleave.Rotate(blocks...); err != nil {
		return err
	}
	stats := make([]perf.BandwidthStats, len(series))
	for i, s := range series {
		stats[i] = perf.Bandwidth(pairBWSize, s.Marks, cfg.txDepth)
		stats[i].Label = labels[i]
	}
	return c.out.Add(perf.Result{
		Title: title + perf.SizeName(pairBWSize), Test: testPairWrite,
		Mode: perf.ModeBW, Column: "series", Placement: c.place,
		Info: []perf.Field{
			{Key: "Series", Value: "tcp: one Go TCP stream, until the receiver has it all; " + what},
			{Key: "Blocks", Value: fmt.Sprintf("%d of %d x %d B per series, rotating", interleave.Blocks, per, pairBWSize)},
			{Key: "TX depth", Value: strconv.Itoa(cfg.txDepth)},
			{Key: "CQ moderation", Value: strconv.Itoa(cfg.cqMod)},
			{Key: "Fabric", Value: c.fabricIn},
			{Key: "Server MR", Value: serverMR},
		},
		Bandwidth: stats,
	})
}
