package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/perf"
	"github.com/krcore/krcore/verbs"
)

// Test names and series labels of the KRCore results.
const (
	testKrConnect = "krcore-connect" // cold/warm connect beside one READ
	testKrRate    = "krcore-rate"    // warm connects per second
	testVQRead    = "vq-read"        // VQ vs raw QP, 8 B READ
	testVQWrite   = "vq-write"       // VQ vs raw QP, 8 B WRITE
	testVQSend    = "vq-send"        // VQ vs raw RC, 64 B SEND round trip

	seriesCold     = "cold"
	seriesWarm     = "warm"
	seriesMetaRead = "meta_read"
	seriesRead8    = "read_8B"
	seriesVQ       = "vq"
	seriesQP       = "qp"
	// medianSuffix labels a bandwidth row holding a series' median block.
	medianSuffix = "_median_block"
)

// Sizes of the KRCore comparisons, as the targets name them.
const (
	vqOneSidedSize = 8
	vqTwoSidedSize = 64
)

// krRuntime is a client-side runtime joined to the server's MetaServer.
type krRuntime struct {
	rt     *core.Runtime
	server core.NodeID
	info   meta.Info
}

// close closes the client runtime.
func (k *krRuntime) close() error {
	if err := k.rt.Close(); err != nil {
		return fmt.Errorf("close client runtime: %w", err)
	}
	return nil
}

// startKr has the server start its runtime (once per session) and starts a
// client runtime on this side's RNIC under a fresh node id.
func (c *client) startKr() (*krRuntime, error) {
	cfg := c.cfg
	rep, err := c.ctl.call(&msg{Op: opKrStart}, cfg.timeout)
	if err != nil {
		return nil, fmt.Errorf("start the server's KRCore runtime: %w", err)
	}
	info, err := meta.ParseInfo(rep.Meta)
	if err != nil {
		return nil, fmt.Errorf("server's MetaServer: %w", err)
	}
	if rep.NodeID == 0 {
		return nil, errors.New("server's runtime has node id 0")
	}
	node := c.nextNode
	c.nextNode++
	ctx, cancel := context.WithTimeout(c.ctx, cfg.timeout)
	defer cancel()
	rt, err := core.New(ctx, core.Config{Device: c.dev, Node: node, Meta: []meta.Info{info},
		Credits: max(128, cfg.txDepth), Logger: slogTo(c.stderr)})
	if err != nil {
		return nil, fmt.Errorf("start client KRCore runtime (node %d): %w", node, err)
	}
	return &krRuntime{rt: rt, server: core.NodeID(rep.NodeID), info: info}, nil
}

// connIters is the iterations of the KRCore connect series: -n, else the
// latency default.
func (cfg *config) connIters() (iters, warmup int) { return cfg.iters(modeLat, 8) }

// runKrConnect compares KRCore connects with one RDMA READ on the same
// fabric, in interleaved blocks: cold (a node the runtime does not know:
// one MetaServer READ), warm (peer cached), the MetaServer lookup alone
// (meta.Client.Fetch, the READ a cold connect makes), and an 8 B READ on a
// raw RC QP to the MetaServer's node. Then warm connects per second.
func (c *client) runKrConnect() (err error) {
	cfg := c.cfg
	kr, err := c.startKr()
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, kr.close()) }()
	rt, server := kr.rt, kr.server
	q, err := rt.Queue()
	if err != nil {
		return err
	}
	defer q.Close()
	mc, err := meta.NewClient(c.dev, []meta.Info{kr.info}, meta.ClientConfig{})
	if err != nil {
		return fmt.Errorf("MetaServer client: %w", err)
	}
	defer mc.Close()
	r, err := c.openRun(testRead, modeLat, 8, 0)
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, c.closeRun(r)) }()
	dl := newDeadline(c.ctx, cfg.timeout)
	defer dl.close()
	spec := opSpec{op: verbs.OpRead, size: 8, remote: r.mr}

	iters, warmup := cfg.connIters()
	per := perBlock(iters)
	var cold, warm, fetch, read []time.Duration
	coldBlock := func(n int, keep bool) error {
		for i := range n {
			// A fresh VQ to a node the runtime does not know.
			fresh, err := rt.Queue()
			if err != nil {
				return err
			}
			ctx := dl.get()
			if err := rt.Forget(ctx, server); err != nil {
				fresh.Close()
				return fmt.Errorf("forget the server: %w", err)
			}
			t0 := time.Now()
			err = fresh.Connect(ctx, server)
			d := time.Since(t0)
			fresh.Close()
			if err != nil {
				return fmt.Errorf("cold connect #%d: %w", i, err)
			}
			if keep {
				cold = append(cold, d)
			}
		}
		return nil
	}
	warmBlock := func(n int, keep bool) error {
		for i := range n {
			ctx := dl.get()
			t0 := time.Now()
			err := q.Connect(ctx, server)
			d := time.Since(t0)
			if err != nil {
				return fmt.Errorf("warm connect #%d: %w", i, err)
			}
			if keep {
				warm = append(warm, d)
			}
		}
		return nil
	}
	fetchBlock := func(n int, keep bool) error {
		for i := range n {
			ctx := dl.get()
			t0 := time.Now()
			_, err := mc.Fetch(ctx, server)
			d := time.Since(t0)
			if err != nil {
				return fmt.Errorf("MetaServer fetch #%d: %w", i, err)
			}
			if keep {
				fetch = append(fetch, d)
			}
		}
		return nil
	}
	readBlock := func(n int, keep bool) error {
		s, err := r.ep.latency(r.p, spec, 0, n)
		if keep {
			read = append(read, s...)
		}
		return err
	}
	// Warm-up: the first fetch learns the table's geometry (a UD round
	// trip), the first READs dial the fabric link if nothing did yet.
	if err := mc.Hello(dl.get()); err != nil {
		return fmt.Errorf("MetaServer hello: %w", err)
	}
	for _, f := range []func(int, bool) error{coldBlock, warmBlock, fetchBlock, readBlock} {
		if err := f(warmup, false); err != nil {
			return err
		}
	}
	st0, ms0 := rt.Stats(), rt.MetaStats()
	c.logf("krcore connect: %d blocks of %d cold, warm, MetaServer fetches and READs", pairBlocks, per)
	if err := alternateN(
		func() error { return coldBlock(per, true) },
		func() error { return warmBlock(per, true) },
		func() error { return fetchBlock(per, true) },
		func() error { return readBlock(per, true) },
	); err != nil {
		return err
	}
	st1, ms1 := rt.Stats(), rt.MetaStats()
	colds, reads := st1.ColdConnects-st0.ColdConnects, ms1.Reads-ms0.Reads
	if want := uint64(len(cold)); colds != want {
		return fmt.Errorf("krcore connect: %d of %d cold connects were cold (the runtime kept the peer: an RC connection?)", colds, want)
	}
	series := "cold: Runtime.Forget(node), then Connect of a fresh VQ (peer and meta cache empty: one MetaServer READ); warm: Queue.Connect, peer cached; " +
		"meta_read: meta.Client.Fetch of the server's record (the READ a cold connect makes: one 512 B bucket over DC); " +
		"read_8B: one 8 B RDMA READ on a raw RC QP to the MetaServer's node"
	if st1.RCOnly {
		series = "RC-only mode (no DC on the device). cold: Runtime.Forget(node) (closes the pooled RC QP, both ends), then Connect of a fresh VQ: " +
			"one MetaServer READ over the meta client's kept RC QP, then an RC QP built with the node (UD handshake: create, connect both ends); " +
			"warm: Queue.Connect with the RC QP pooled; meta_read: meta.Client.Fetch of the server's record (one 512 B bucket READ over RC); " +
			"read_8B: one 8 B RDMA READ on a raw RC QP to the MetaServer's node"
	}
	rows := []perf.LatencyStats{perf.Latency(0, cold), perf.Latency(0, warm), perf.Latency(8, fetch), perf.Latency(8, read)}
	for i, l := range []string{seriesCold, seriesWarm, seriesMetaRead, seriesRead8} {
		rows[i].Label = l
	}
	if err := c.out.add(perf.Result{
		Title: "KRCore Connect Test (interleaved)", Test: testKrConnect, Mode: perf.ModeLat, Column: "series", Placement: c.place,
		Info: []perf.Field{
			{Key: "Runtimes", Value: fmt.Sprintf("client node %d joined the MetaServer embedded in server node %d (%s)", rt.Node(), server, kr.info.Addr)},
			{Key: "Fabric", Value: c.fabricIn},
			{Key: "Series", Value: series},
			{Key: "Blocks", Value: fmt.Sprintf("%d of %d per series, rotating order", pairBlocks, per)},
			{Key: "Cold connects", Value: fmt.Sprintf("%d, costing %d MetaServer READs", colds, reads)},
			{Key: "CQ polling", Value: "read_8B: " + c.polling() + "; connects and meta_read: the runtime's and meta client's own waits"},
		},
		Latency: rows,
	}); err != nil {
		return err
	}
	rate, err := connectRate(c.ctx, rt, server, cfg, c.place, c.fabricIn)
	if err != nil {
		return err
	}
	return c.out.add(rate)
}

// rateOps is how many warm connects each goroutine makes per row.
func (cfg *config) rateOps() int {
	if cfg.n > 0 {
		return max(cfg.n*100, 1000)
	}
	return 200_000
}

// connectRate measures warm connects per second with one goroutine and
// with one per core (GOMAXPROCS), each on its own VQ, in alternating
// blocks.
func connectRate(ctx context.Context, rt *core.Runtime, server core.NodeID, cfg *config, place, fabricIn string) (perf.Result, error) {
	gs := []int{1}
	if n := runtime.GOMAXPROCS(0); n > 1 {
		gs = append(gs, n)
	}
	res := perf.Result{Title: "KRCore Warm Connect Rate Test", Test: testKrRate, Mode: perf.ModeBW, Column: "goroutines", Placement: place,
		Info: []perf.Field{
			{Key: "Runtime", Value: fmt.Sprintf("node %d, embedded in this process; peer node %d cached", rt.Node(), server)},
			{Key: "Fabric", Value: fabricIn},
			{Key: "Rate", Value: "MsgRate = million Queue.Connect calls per second, all goroutines together (each on its own VQ)"},
			{Key: "Rows", Value: "N: the whole series of N goroutines; N" + medianSuffix + ": its block with the median rate (one scheduler stall cannot move it)"},
		}}
	ops := cfg.rateOps()
	per := perBlock(ops)
	total := make([]time.Duration, len(gs))
	blocks := make([][][]perf.Mark, len(gs))
	block := func(k int) func() error {
		return func() error {
			d, err := connectBurst(ctx, rt, server, gs[k], per, cfg.timeout)
			total[k] += d
			blocks[k] = append(blocks[k], []perf.Mark{{}, {At: d, Msgs: gs[k] * per}})
			return err
		}
	}
	// Warm-up: fault in the code and the scheduler's threads.
	if _, err := connectBurst(ctx, rt, server, gs[len(gs)-1], min(per, 1000), cfg.timeout); err != nil {
		return res, fmt.Errorf("connect rate warm-up: %w", err)
	}
	second := func() error { return nil }
	if len(gs) > 1 {
		second = block(1)
	}
	if err := alternate(block(0), second); err != nil {
		return res, fmt.Errorf("connect rate: %w", err)
	}
	for k, g := range gs {
		n := g * per * pairBlocks
		bw := perf.Bandwidth(0, []perf.Mark{{}, {At: total[k], Msgs: n}}, 1)
		bw.Label = strconv.Itoa(g)
		res.Bandwidth = append(res.Bandwidth, bw)
	}
	for k, g := range gs {
		bw := perf.MedianBlock(0, blocks[k], 1)
		bw.Label = strconv.Itoa(g) + medianSuffix
		res.Bandwidth = append(res.Bandwidth, bw)
	}
	return res, nil
}

// connectBurst has g goroutines make n warm connects each, and returns the
// time from their common start to the last one's end.
func connectBurst(ctx context.Context, rt *core.Runtime, server core.NodeID, g, n int, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	qs := make([]*core.Queue, g)
	defer func() {
		for _, q := range qs {
			if q != nil {
				q.Close()
			}
		}
	}()
	for i := range qs {
		q, err := rt.Queue()
		if err != nil {
			return 0, err
		}
		if err := q.Connect(ctx, server); err != nil {
			return 0, fmt.Errorf("connect: %w", err)
		}
		qs[i] = q
	}
	start := make(chan struct{})
	errs := make([]error, g)
	var wg sync.WaitGroup
	for i, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range n {
				if err := q.Connect(ctx, server); err != nil {
					errs[i] = fmt.Errorf("warm connect: %w", err)
					return
				}
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// alternateN runs pairBlocks blocks of each function, the order rotating
// and reversing from block to block (ABC, CBA, BCA, ACB ...), so no series
// always runs first or right after the same neighbour.
func alternateN(fs ...func() error) error {
	n := len(fs)
	for i := range pairBlocks {
		for k := range n {
			j := (k + i/2) % n
			if i%2 == 1 {
				j = (n - 1 - k + i/2) % n
			}
			if err := fs[j](); err != nil {
				return err
			}
		}
	}
	return nil
}
