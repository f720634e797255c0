package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/krcore/krcore"
	krclient "github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/meta"
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

// krRuntime is the client side's KRCore runtime, joined to the server's
// MetaServer: one embedded in this process, or krcored's (-daemon).
type krRuntime struct {
	api    krcore.API
	rt     *core.Runtime // the embedded runtime; nil through krcored
	server krcore.NodeID
	info   meta.Info
}

// close closes the embedded runtime or detaches from krcored.
func (k *krRuntime) close() error {
	if err := k.api.Close(); err != nil {
		return fmt.Errorf("close client runtime: %w", err)
	}
	return nil
}

// startKr has the server start its runtime (once per session, unless it
// keeps one) and starts a client runtime on this side's RNIC under the node
// id the server hands out, or attaches to krcored with -daemon.
func (c *client) startKr() (*krRuntime, error) {
	cfg := c.cfg
	rep, err := c.ctl.Call(&control.Msg{Op: control.OpKrStart}, cfg.timeout)
	if err != nil {
		return nil, fmt.Errorf("start the server's KRCore runtime: %w", err)
	}
	info, err := meta.ParseInfo(rep.Meta)
	if err != nil {
		return nil, fmt.Errorf("server's MetaServer: %w", err)
	}
	if rep.NodeID == 0 || rep.Client == 0 {
		return nil, fmt.Errorf("server's runtime has node id %d and gave the client %d", rep.NodeID, rep.Client)
	}
	server := krcore.NodeID(rep.NodeID)
	ctx, cancel := context.WithTimeout(c.ctx, cfg.timeout)
	defer cancel()
	if cfg.daemon != "" {
		return c.attachKr(ctx, server, info)
	}
	node := krcore.NodeID(rep.Client)
	rt, err := core.New(ctx, core.Config{Device: c.dev, Node: node, Meta: []meta.Info{info},
		Credits: max(128, cfg.txDepth), Logger: slogTo(c.stderr)})
	if err != nil {
		return nil, fmt.Errorf("start client KRCore runtime (node %d): %w", node, err)
	}
	return &krRuntime{api: core.Embed(rt), rt: rt, server: server, info: info}, nil
}

// attachKr attaches to the krcored at -daemon.
func (c *client) attachKr(ctx context.Context, server krcore.NodeID, info meta.Info) (*krRuntime, error) {
	cl, err := krclient.Attach(ctx, krclient.Options{Socket: c.cfg.daemon, CallTimeout: c.cfg.timeout})
	if err != nil {
		return nil, fmt.Errorf("attach krcored at %s: %w", c.cfg.daemon, err)
	}
	if cl.Node() == server {
		cl.Close()
		return nil, fmt.Errorf("krcored at %s runs node %d, the server's own id", c.cfg.daemon, server)
	}
	return &krRuntime{api: cl, server: server, info: info}, nil
}

// where says which runtime the KRCore series run on, for table preambles.
func (c *client) where(kr *krRuntime) string {
	if kr.rt == nil {
		return fmt.Sprintf("node %d: krcored at %s, through package client", kr.api.Node(), c.cfg.daemon)
	}
	return fmt.Sprintf("node %d: embedded in this process", kr.api.Node())
}

// daemonSuffix marks the rows of series that went through krcored.
const daemonSuffix = "_" + seriesDaemon

// label is a KRCore series' row label: suffixed with daemonSuffix when it
// went through krcored.
func (c *client) label(series string) string {
	if c.cfg.daemon != "" {
		return series + daemonSuffix
	}
	return series
}

// krTitle is a KRCore table's title, saying when it went through krcored.
func (c *client) krTitle(t string) string {
	if c.cfg.daemon != "" {
		return t + " through krcored"
	}
	return t
}

// connIters is the iterations of the KRCore connect series: -n, else the
// latency default.
func (cfg *config) connIters() (iters, warmup int) { return cfg.iters(modeLat, 8) }

// runKrConnect compares KRCore connects with one RDMA READ on the same
// fabric, in interleaved blocks: cold (a node the runtime does not know:
// one MetaServer READ), warm (peer cached), the MetaServer lookup alone
// (meta.Client.Fetch, the READ a cold connect makes), and an 8 B READ on a
// raw RC QP to the MetaServer's node. Then warm connects per second.
// Through krcored there is no cold series: clients cannot make the daemon's
// runtime forget a peer.
func (c *client) runKrConnect() (err error) {
	cfg := c.cfg
	kr, err := c.startKr()
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, kr.close()) }()
	q, err := kr.api.Queue()
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
	dl := rawqp.NewDeadline(c.ctx, cfg.timeout)
	defer dl.Close()
	b := &connBlocks{kr: kr, q: q, mc: mc, dl: dl, r: r}

	iters, warmup := cfg.connIters()
	per := interleave.PerBlock(iters)
	series := []func(int, bool) error{b.warmBlock, b.fetchBlock, b.readBlock}
	if kr.rt != nil {
		series = append([]func(int, bool) error{b.coldBlock}, series...)
	}
	// Warm-up: the first fetch learns the table's geometry (a UD round
	// trip), the first READs dial the fabric link if nothing did yet.
	if err := mc.Hello(dl.Get()); err != nil {
		return fmt.Errorf("MetaServer hello: %w", err)
	}
	for _, f := range series {
		if err := f(warmup, false); err != nil {
			return c.connectErr(kr, err)
		}
	}
	st0 := kr.api.Stats()
	var ms0 meta.ClientStats
	if kr.rt != nil {
		ms0 = kr.rt.MetaStats()
	}
	c.logf("krcore connect: %d blocks of %d of %d series", interleave.Blocks, per, len(series))
	blocks := make([]func() error, len(series))
	for i, f := range series {
		blocks[i] = func() error { return f(per, true) }
	}
	if err := interleave.Rotate(blocks...); err != nil {
		return err
	}
	st1 := kr.api.Stats()
	info := []perf.Field{
		{Key: "Runtimes", Value: fmt.Sprintf("client %s; joined the MetaServer of server node %d (%s)", c.where(kr), kr.server, kr.info)},
		{Key: "Fabric", Value: c.fabricIn},
		{Key: "Series", Value: connSeriesText(st1.RCOnly, kr.rt == nil)},
		{Key: "Blocks", Value: fmt.Sprintf("%d of %d per series, rotating order", interleave.Blocks, per)},
	}
	if kr.rt != nil {
		ms1 := kr.rt.MetaStats()
		colds, reads := st1.ColdConnects-st0.ColdConnects, ms1.Reads-ms0.Reads
		if want := uint64(len(b.cold)); colds != want {
			return fmt.Errorf("krcore connect: %d of %d cold connects were cold (the runtime kept the peer: an RC connection?)", colds, want)
		}
		info = append(info, perf.Field{Key: "Cold connects", Value: fmt.Sprintf("%d, costing %d MetaServer READs", colds, reads)})
	}
	info = append(info, perf.Field{Key: "CQ polling", Value: "read_8B: " + c.polling() + "; connects and meta_read: the runtime's and meta client's own waits"})
	var rows []perf.LatencyStats
	if kr.rt != nil {
		rows = append(rows, labelled(perf.Latency(0, b.cold), seriesCold))
	}
	rows = append(rows, labelled(perf.Latency(0, b.warm), c.label(seriesWarm)),
		labelled(perf.Latency(8, b.fetch), seriesMetaRead), labelled(perf.Latency(8, b.read), seriesRead8))
	if err := c.out.Add(perf.Result{
		Title: c.krTitle("KRCore Connect Test (interleaved)"), Test: testKrConnect, Mode: perf.ModeLat, Column: "series", Placement: c.place,
		Info: info, Latency: rows,
	}); err != nil {
		return err
	}
	rate, err := c.connectRate(kr)
	if err != nil {
		return err
	}
	return c.out.Add(rate)
}

// labelled sets l's label.
func labelled(l perf.LatencyStats, label string) perf.LatencyStats {
	l.Label = label
	return l
}

// connSeriesText says what the connect table's series measure.
func connSeriesText(rcOnly, daemon bool) string {
	warm := "warm: Queue.Connect, peer cached"
	switch {
	case daemon && rcOnly:
		warm = "warm_daemon: VQ.Connect through krcored (a ring round trip; the daemon's runtime has the RC QP pooled); " +
			"no cold series (clients cannot make the daemon forget a peer)"
	case daemon:
		warm = "warm_daemon: VQ.Connect through krcored (a ring round trip; the daemon's runtime has the peer cached); " +
			"no cold series (clients cannot make the daemon forget a peer)"
	case rcOnly:
		warm = "warm: Queue.Connect with the RC QP pooled"
	}
	read := "read_8B: one 8 B RDMA READ on a raw RC QP to the MetaServer's node"
	switch {
	case rcOnly:
		return "RC-only mode (no DC on the device). " + coldText(daemon,
			"cold: Runtime.Forget(node) (closes the pooled RC QP, both ends), then Connect of a fresh VQ: "+
				"one MetaServer READ over the meta client's kept RC QP, then an RC QP built with the node (UD handshake: create, connect both ends); ") +
			warm + "; meta_read: meta.Client.Fetch of the server's record (one 512 B bucket READ over RC); " + read
	}
	return coldText(daemon, "cold: Runtime.Forget(node), then Connect of a fresh VQ (peer and meta cache empty: one MetaServer READ); ") +
		warm + "; meta_read: meta.Client.Fetch of the server's record (the READ a cold connect makes: one 512 B bucket over DC); " + read
}

// coldText is the cold series' description, empty through krcored.
func coldText(daemon bool, s string) string {
	if daemon {
		return ""
	}
	return s
}

// connBlocks are the connect table's series, each run in blocks of n
// (kept or, warming up, thrown away).
type connBlocks struct {
	kr                      *krRuntime
	q                       krcore.VQ
	mc                      *meta.Client
	dl                      *rawqp.Deadline
	r                       *rdmaRun
	cold, warm, fetch, read []time.Duration
}

// coldBlock: a fresh VQ to a node the runtime does not know.
func (b *connBlocks) coldBlock(n int, keep bool) error {
	for i := range n {
		fresh, err := b.kr.rt.Queue()
		if err != nil {
			return err
		}
		ctx := b.dl.Get()
		if err := b.kr.rt.Forget(ctx, b.kr.server); err != nil {
			fresh.Close()
			return fmt.Errorf("forget the server: %w", err)
		}
		t0 := time.Now()
		err = fresh.Connect(ctx, b.kr.server, nil)
		d := time.Since(t0)
		fresh.Close()
		if err != nil {
			return fmt.Errorf("cold connect #%d: %w", i, err)
		}
		if keep {
			b.cold = append(b.cold, d)
		}
	}
	return nil
}

func (b *connBlocks) warmBlock(n int, keep bool) error {
	for i := range n {
		ctx := b.dl.Get()
		t0 := time.Now()
		err := b.q.Connect(ctx, b.kr.server, nil)
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("warm connect #%d: %w", i, err)
		}
		if keep {
			b.warm = append(b.warm, d)
		}
	}
	return nil
}

func (b *connBlocks) fetchBlock(n int, keep bool) error {
	for i := range n {
		ctx := b.dl.Get()
		t0 := time.Now()
		_, err := b.mc.Fetch(ctx, b.kr.server)
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("MetaServer fetch #%d: %w", i, err)
		}
		if keep {
			b.fetch = append(b.fetch, d)
		}
	}
	return nil
}

func (b *connBlocks) readBlock(n int, keep bool) error {
	spec := rawqp.Spec{Op: verbs.OpRead, Size: 8, Remote: b.r.mr}
	s, err := b.r.ep.Latency(b.r.p, spec, 0, n)
	if keep {
		b.read = append(b.read, s...)
	}
	return err
}

// connectErr adds, through krcored, the likely cause of a failed first
// connect to the server: a daemon that joined another MetaServer.
func (c *client) connectErr(kr *krRuntime, err error) error {
	if kr.rt != nil || err == nil {
		return err
	}
	return fmt.Errorf("%w (through krcored at %s, node %d: did it start with -meta of this server's MetaServer, printed by -keep-runtime?)",
		err, c.cfg.daemon, kr.api.Node())
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
func (c *client) connectRate(kr *krRuntime) (perf.Result, error) {
	ctx, rt, server, cfg := c.ctx, kr.api, kr.server, c.cfg
	gs := []int{1}
	if n := runtime.GOMAXPROCS(0); n > 1 {
		gs = append(gs, n)
	}
	res := perf.Result{Title: c.krTitle("KRCore Warm Connect Rate Test"), Test: testKrRate, Mode: perf.ModeBW, Column: "goroutines", Placement: c.place,
		Info: []perf.Field{
			{Key: "Runtime", Value: fmt.Sprintf("%s; peer node %d cached", c.where(kr), server)},
			{Key: "Fabric", Value: c.fabricIn},
			{Key: "Rate", Value: "MsgRate = million Queue.Connect calls per second, all goroutines together (each on its own VQ)"},
			{Key: "Rows", Value: "N: the whole series of N goroutines; N" + medianSuffix + ": its block with the median rate (one scheduler stall cannot move it)"},
		}}
	ops := cfg.rateOps()
	per := interleave.PerBlock(ops)
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
	if err := interleave.Pair(block(0), second); err != nil {
		return res, fmt.Errorf("connect rate: %w", err)
	}
	for k, g := range gs {
		n := g * per * interleave.Blocks
		bw := perf.Bandwidth(0, []perf.Mark{{}, {At: total[k], Msgs: n}}, 1)
		bw.Label = c.label(strconv.Itoa(g))
		res.Bandwidth = append(res.Bandwidth, bw)
	}
	for k, g := range gs {
		bw := perf.MedianBlock(0, blocks[k], 1)
		bw.Label = c.label(strconv.Itoa(g)) + medianSuffix
		res.Bandwidth = append(res.Bandwidth, bw)
	}
	return res, nil
}

// connectBurst has g goroutines make n warm connects each, and returns the
// time from their common start to the last one's end.
func connectBurst(ctx context.Context, rt krcore.API, server krcore.NodeID, g, n int, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	qs := make([]krcore.VQ, g)
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
		if err := q.Connect(ctx, server, nil); err != nil {
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
				if err := q.Connect(ctx, server, nil); err != nil {
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
