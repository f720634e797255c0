package bench

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/krcore/krcore"
	krclient "github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/flags"
	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/bench/report"
	"github.com/krcore/krcore/internal/bench/vqrun"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// krbench daemon compares every VQ benchmark embedded and through krcored
// in one run: 8 B READ and WRITE one at a time and with a window in
// flight, 64 B SEND round trips, warm connects, and warm connects per second
// from 1 and from several client processes. Usage:
//
//	krbench daemon [-n N] [-spin D] [-procs 4] [-json] [-check]
//	krbench daemon -daemon SOCKET -meta INFO   # a running krcored; INFO is its MetaServer (logged at start)
//	krbench daemon -krcored PATH               # start this krcored binary instead of krbench's own
//
// The server node (it exports the region READ and WRITE, and echoes
// messages) runs in a child process of its own, with the cluster's
// MetaServer (or joining -meta's): so the embedded client, in this process,
// reaches it across processes exactly as the daemon does, and the two
// series differ only by the daemon's path. Without -daemon it also starts
// krcored as a child process (this binary in its krcored role, or -krcored
// PATH with the same flags) on a soft node that joins the same MetaServer.

// Test names and series of the daemon comparison.
const (
	testDRead    = "daemon-read"
	testDReadOwn = "daemon-read-own"
	testDWrite   = "daemon-write"
	testDSend    = "daemon-send"
	testDConnect = "daemon-connect"

	seriesEmbedded = "embedded"
	seriesDaemon   = "daemon"

	// Node ids: the daemon gets dNodeDaemon unless it is a running one.
	dNodeServer, dNodeEmbedded, dNodeDaemon = 101, 102, 103
	dRegion                                 = "krbench-daemon"
	dOwnRegion                              = "krbench-daemon-own"
	// Targets: KRCore's ioctl path adds ~0.85 us to a READ; a warm connect
	// through the daemon is a ring round trip.
	targetDaemonReadPlusUsec  = 1.0
	targetDaemonConnectUsec   = 5.0
	childKrcored, childConnex = "krcored-child", "daemon-connector"
	childServer               = "daemon-server"
	childCoreRTT              = "cross-core-rtt"
)

// dConfig is krbench daemon's command line.
type dConfig struct {
	socket, metaInfo, krcored string
	n, procs                  int
	spin, timeout, share      time.Duration
	json, check               bool
	txDepth, cqMod            int
}

func parseDaemon(args []string, stderr io.Writer) (*dConfig, error) {
	fs := flag.NewFlagSet("krbench daemon", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := &dConfig{}
	fs.StringVar(&d.socket, "daemon", "", "attach to the krcored at this socket instead of starting one (needs -meta)")
	fs.StringVar(&d.metaInfo, "meta", "", "the running krcored's MetaServer (meta.Info text), with -daemon")
	fs.StringVar(&d.krcored, "krcored", "", "krcored binary to start (default: this binary in its krcored role)")
	fs.IntVar(&d.n, "n", 2000, "iterations per latency series")
	fs.IntVar(&d.procs, "procs", 4, "client processes of the connects/s comparison")
	fs.DurationVar(&d.spin, "spin", 200*time.Microsecond, "poll completions this long before the VQ's own wait (a krcored started here polls its rings as long)")
	fs.DurationVar(&d.timeout, "timeout", time.Minute, "bound on every wait")
	fs.DurationVar(&d.share, "share-quantum", 0, "krcored's -share-quantum for a krcored started here (0: its default)")
	fs.IntVar(&d.txDepth, "tx-depth", 64, "requests in flight in the bw series")
	fs.IntVar(&d.cqMod, "cq-mod", 16, "one request in cq-mod signaled in the bw series")
	fs.BoolVar(&d.json, "json", false, "one JSON document")
	fs.BoolVar(&d.check, "check", false, "exit with status 3 when a target is missed")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if (d.socket == "") != (d.metaInfo == "") {
		return nil, fmt.Errorf("%w: -daemon and -meta go together", flags.ErrUsage)
	}
	if d.n < interleave.Blocks || d.procs < 1 || d.cqMod < 1 || d.txDepth < d.cqMod {
		return nil, fmt.Errorf("%w: -n >= %d, -procs >= 1, -tx-depth >= -cq-mod >= 1", flags.ErrUsage, interleave.Blocks)
	}
	return d, nil
}

// runDaemonCmd is krbench daemon.
func runDaemonCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d, err := parseDaemon(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "krbench daemon: %v\n", err)
		return 2
	}
	out := newOutput(&config{json: d.json}, stdout)
	b := &dBench{d: d, ctx: ctx, out: out, log: slogTo(stderr), stderr: stderr}
	err = b.run()
	if err == nil {
		err = out.Finish(d.check)
	}
	return cmdStatus(stderr, "daemon", err)
}

// dSide is one way to reach the runtime: embedded or through krcored.
type dSide struct {
	name  string
	api   krcore.API
	q     krcore.VQ // one-sided, connected to the server
	cq    krcore.VQ // connect series
	g     krcore.Region
	local krcore.MR
	ping  *vqrun.Ping
	// own reads the side's own node: no fabric, the daemon's cost alone
	own    krcore.VQ
	ownG   krcore.Region
	ownMem krcore.MR
}

// dBench owns everything one krbench daemon run starts.
type dBench struct {
	d         *dConfig
	ctx       context.Context
	out       *report.Output
	log       *slog.Logger
	stderr    io.Writer
	poll      vqrun.Poll
	role      string        // the server child's role; empty: childServer
	tcpLink   bool          // every node (children too) reaches the others over the soft TCP link
	serverOut *bufio.Reader // its stdout, after the MetaServer's line

	devs   []verbs.Device
	emb    *core.Runtime
	server *exec.Cmd // the server node's process
	child  *exec.Cmd // krcored's
	sock   string
	cl     *krclient.Client
	sides  []*dSide
	tmp    string
}

func (b *dBench) run() (err error) {
	defer func() { err = firstErr(err, b.close()) }()
	b.poll = vqrun.Poll{Spin: b.d.spin}
	if err := b.start(); err != nil {
		return err
	}
	for _, f := range []func() error{b.machine("before"), b.latency, b.machine("after"), b.bandwidth, b.twoSided, b.connects, b.rates} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// start brings up the server node, the embedded node and the daemon.
func (b *dBench) start() error {
	ctx, cancel := context.WithTimeout(b.ctx, b.d.timeout)
	defer cancel()
	var metas []meta.Info
	if b.d.metaInfo != "" {
		info, err := meta.ParseInfo(b.d.metaInfo)
		if err != nil {
			return fmt.Errorf("-meta: %w", err)
		}
		metas = []meta.Info{info}
	}
	info, err := b.startServer(ctx, metas)
	if err != nil {
		return fmt.Errorf("server node: %w", err)
	}
	metas = []meta.Info{info}
	if b.emb, err = b.node(ctx, dNodeEmbedded, metas); err != nil {
		return err
	}
	if err := b.startDaemon(ctx, metas[0]); err != nil {
		return err
	}
	for _, s := range []*dSide{{name: seriesEmbedded, api: core.Embed(b.emb)}, {name: seriesDaemon, api: b.cl}} {
		b.sides = append(b.sides, s)
		if err := b.open(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

// node starts a soft node on loopback TCP (the daemon is another process)
// and a runtime on it.
func (b *dBench) node(ctx context.Context, id krcore.NodeID, metas []meta.Info) (*core.Runtime, error) {
	dev, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", TCPOnly: b.tcpLink})
	if err != nil {
		return nil, err
	}
	b.devs = append(b.devs, dev)
	rt, err := core.New(ctx, core.Config{Device: dev, Node: id, Meta: metas, Credits: max(128, b.d.txDepth), Logger: b.log})
	if err != nil {
		return nil, fmt.Errorf("runtime of node %d: %w", id, err)
	}
	return rt, nil
}

// startServer starts the server node's process and returns the MetaServer
// the nodes join: the server's own, or the one in metas.
func (b *dBench) startServer(ctx context.Context, metas []meta.Info) (meta.Info, error) {
	exe, err := os.Executable()
	if err != nil {
		return meta.Info{}, err
	}
	args := []string{cmp.Or(b.role, childServer)}
	if len(metas) > 0 {
		args = append(args, "-meta", metas[0].String())
	}
	b.server = exec.Command(exe, args...)
	b.server.Stderr = b.stderr
	b.childEnv(b.server)
	setChildAttrs(b.server)
	out, err := b.server.StdoutPipe()
	if err != nil {
		return meta.Info{}, err
	}
	if err := b.server.Start(); err != nil {
		return meta.Info{}, fmt.Errorf("start: %w", err)
	}
	line := make(chan string, 1)
	b.serverOut = bufio.NewReader(out)
	go func() { // the server's first line: its MetaServer, once it serves
		l, _ := b.serverOut.ReadString('\n')
		line <- strings.TrimSpace(l)
	}()
	select {
	case l := <-line:
		return meta.ParseInfo(l)
	case <-ctx.Done():
		return meta.Info{}, fmt.Errorf("waiting for it: %w", ctx.Err())
	}
}

// startDaemon starts krcored as a child (unless -daemon names one) and
// attaches to it.
func (b *dBench) startDaemon(ctx context.Context, info meta.Info) error {
	b.sock = b.d.socket
	if b.sock == "" {
		var err error
		if b.tmp, err = os.MkdirTemp("", "krbench-daemon"); err != nil {
			return err
		}
		b.sock = filepath.Join(b.tmp, "krcored.sock")
		exe, args := b.d.krcored, []string{}
		if exe == "" {
			if exe, err = os.Executable(); err != nil {
				return err
			}
			args = append(args, childKrcored)
		}
		args = append(args, "-socket", b.sock, "-node", strconv.Itoa(dNodeDaemon), "-listen", "127.0.0.1:0",
			"-meta", info.String(), "-log-level", "warn", "-spin", b.d.spin.String())
		if b.d.share != 0 {
			args = append(args, "-share-quantum", b.d.share.String())
		}
		b.child = exec.Command(exe, args...)
		b.child.Stderr = b.stderr
		b.childEnv(b.child)
		setChildAttrs(b.child)
		if err := b.child.Start(); err != nil {
			return fmt.Errorf("start krcored: %w", err)
		}
	}
	for {
		cl, err := krclient.Attach(ctx, krclient.Options{Socket: b.sock, CallTimeout: b.d.timeout})
		if err == nil {
			b.cl = cl
			return nil
		}
		if b.d.socket != "" || ctx.Err() != nil {
			return fmt.Errorf("attach krcored: %w", err)
		}
		select { // the child is still binding its socket
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// childEnv forces a child's soft nodes onto the TCP link when b's are.
func (b *dBench) childEnv(cmd *exec.Cmd) {
	if b.tcpLink {
		cmd.Env = append(os.Environ(), soft.EnvLink+"=tcp")
	}
}

func (b *dBench) open(ctx context.Context, s *dSide) error {
	var err error
	if s.local, err = s.api.RegMR(4096, verbs.AccessAll); err != nil {
		return err
	}
	for _, q := range []*krcore.VQ{&s.q, &s.cq} {
		if *q, err = s.api.Queue(); err != nil {
			return err
		}
		if err = (*q).Connect(ctx, dNodeServer, nil); err != nil {
			return err
		}
	}
	if s.g, err = s.q.Region(ctx, dRegion); err != nil {
		return err
	}
	if err := b.openOwn(ctx, s); err != nil {
		return fmt.Errorf("own node: %w", err)
	}
	s.ping, err = vqrun.NewPing(ctx, s.api, clientPort, dNodeServer, echoPort, b.poll)
	return err
}

// openOwn exports a region on the side's own node and connects a VQ to it.
func (b *dBench) openOwn(ctx context.Context, s *dSide) error {
	var err error
	if s.ownMem, err = s.api.RegMR(4096, verbs.AccessAll); err != nil {
		return err
	}
	if err = s.api.Export(dOwnRegion, s.ownMem, 0, 4096, verbs.AccessRemoteRead|verbs.AccessRemoteWrite); err != nil {
		return err
	}
	if s.own, err = s.api.Queue(); err != nil {
		return err
	}
	if err = s.own.Connect(ctx, s.api.Node(), nil); err != nil {
		return err
	}
	s.ownG, err = s.own.Region(ctx, dOwnRegion)
	return err
}

func (b *dBench) close() error {
	var errs []error
	for _, s := range b.sides {
		for _, q := range []krcore.VQ{s.q, s.cq, s.own} {
			if q != nil {
				q.Close()
			}
		}
		if s.ping != nil {
			errs = append(errs, s.ping.Close())
		}
	}
	if b.cl != nil {
		b.cl.Close()
	}
	if b.child != nil {
		b.child.Process.Signal(syscall.SIGTERM)
		b.child.Wait()
	}
	if b.server != nil {
		b.server.Process.Signal(syscall.SIGTERM)
		b.server.Wait()
	}
	if b.emb != nil {
		errs = append(errs, b.emb.Close())
	}
	for _, d := range b.devs {
		d.Close()
	}
	if b.tmp != "" {
		os.RemoveAll(b.tmp)
	}
	return errors.Join(errs...)
}

// info is the preamble of every table.
func (b *dBench) info(series string) []perf.Field {
	how := "a krcored child process (this binary's krcored role)"
	switch {
	case b.d.socket != "":
		how = "the running krcored at " + b.d.socket
	case b.d.krcored != "":
		how = "a krcored child process: " + b.d.krcored
	}
	return []perf.Field{
		{Key: "Series", Value: series},
		{Key: "Nodes", Value: fmt.Sprintf("server node %d: a child process; embedded node %d in this process; daemon node %d: %s; soft RNICs over loopback TCP",
			dNodeServer, dNodeEmbedded, b.cl.Node(), how)},
		{Key: "CQ polling", Value: b.poll.String()},
		{Key: "Blocks", Value: fmt.Sprintf("%d per series, alternating (ABBA)", interleave.Blocks)},
	}
}

// pair measures the two sides' latency series in interleaved blocks.
func (b *dBench) pair(title, test string, size int, what string, run func(s *dSide, warmup, iters int) ([]time.Duration, error)) error {
	var series []*interleave.Latency
	for _, s := range b.sides {
		series = append(series, &interleave.Latency{Run: func(w, n int) ([]time.Duration, error) { return run(s, w, n) }})
	}
	if err := interleave.WarmLatency(max(b.d.n/10, 10), series...); err != nil {
		return fmt.Errorf("%s: %w", test, err)
	}
	if err := interleave.Pair(series[0].Block(interleave.PerBlock(b.d.n)), series[1].Block(interleave.PerBlock(b.d.n))); err != nil {
		return fmt.Errorf("%s: %w", test, err)
	}
	var rows []perf.LatencyStats
	for i, s := range series {
		l := perf.Latency(size, s.Samples)
		l.Label = b.sides[i].name
		rows = append(rows, l)
	}
	return b.out.Add(perf.Result{Title: title, Test: test, Mode: perf.ModeLat, Column: "series", Placement: placementCross,
		Info: b.info(what), Latency: rows})
}

func (b *dBench) latency() error {
	dl := rawqp.NewDeadline(b.ctx, b.d.timeout)
	defer dl.Close()
	for _, t := range []struct {
		test, title string
		op          verbs.Opcode
	}{{testDRead, "Embedded vs daemon RDMA_Read Latency, 8 B (interleaved)", verbs.OpRead},
		{testDWrite, "Embedded vs daemon RDMA_Write Latency, 8 B (interleaved)", verbs.OpWrite}} {
		err := b.pair(t.title, t.test, vqOneSidedSize, "VQ.Push, then wait for its completion, one request at a time",
			func(s *dSide, w, n int) ([]time.Duration, error) {
				req := krcore.Request{Op: t.op, Local: s.local.Range(0, vqOneSidedSize), Remote: s.g.At(0)}
				return vqrun.Latency(dl, s.q, b.poll, req, w, n)
			})
		if err != nil {
			return err
		}
	}
	return b.pair("Embedded vs daemon RDMA_Read Latency, 8 B, own node (interleaved)", testDReadOwn, vqOneSidedSize,
		"VQ.Push, then wait for its completion, one request at a time; each side READs a region of its own node, so no fabric hop hides the daemon's cost",
		func(s *dSide, w, n int) ([]time.Duration, error) {
			req := krcore.Request{Op: verbs.OpRead, Local: s.local.Range(0, vqOneSidedSize), Remote: s.ownG.At(0)}
			return vqrun.Latency(dl, s.own, b.poll, req, w, n)
		})
}

// machine reports the cross-core round trip (crossCoreRTT), when the
// latency series ran: the figure the daemon's own-node cost follows. A
// child process measures it, so that no thread of this one, nor one the
// runtime clones from it, keeps the pinning.
func (b *dBench) machine(when string) func() error {
	return func() error {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, exe, childCoreRTT).Output()
		if err != nil {
			return fmt.Errorf("cross-core round trip: %w", err)
		}
		ns, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		if err != nil || ns <= 0 {
			return nil // not measurable here (one CPU, no affinity)
		}
		b.out.AddFigures(perf.Figure(
			fmt.Sprintf("cross-core round trip of a cache line, %s the latency series", when), ns, " ns"))
		return nil
	}
}

func (b *dBench) bandwidth() error {
	dl := rawqp.NewDeadline(b.ctx, b.d.timeout)
	defer dl.Close()
	total := interleave.PerBlock(b.d.n * 10)
	for _, t := range []struct {
		test, title string
		op          verbs.Opcode
	}{{testDRead, "Embedded vs daemon RDMA_Read BW, 8 B (interleaved)", verbs.OpRead},
		{testDWrite, "Embedded vs daemon RDMA_Write BW, 8 B (interleaved)", verbs.OpWrite}} {
		var series []*interleave.Bandwidth
		for _, s := range b.sides {
			req := krcore.Request{Op: t.op, Local: s.local.Range(0, vqOneSidedSize), Remote: s.g.At(0)}
			series = append(series, interleave.NewBandwidth(func(n int) ([]perf.Mark, error) {
				return vqrun.Stream(dl, s.q, b.poll, req, n, b.d.txDepth, b.d.cqMod)
			}))
		}
		if err := interleave.WarmBandwidth(total, series...); err != nil {
			return fmt.Errorf("%s bw: %w", t.test, err)
		}
		if err := interleave.Pair(series[0].Block(total), series[1].Block(total)); err != nil {
			return fmt.Errorf("%s bw: %w", t.test, err)
		}
		var rows []perf.BandwidthStats
		for i, s := range series {
			a := perf.Bandwidth(vqOneSidedSize, s.Marks, b.d.txDepth)
			m := perf.MedianBlock(vqOneSidedSize, s.BlockMarks, b.d.txDepth)
			a.Label, m.Label = b.sides[i].name, b.sides[i].name+medianSuffix
			rows = append(rows, a, m)
		}
		err := b.out.Add(perf.Result{Title: t.title, Test: t.test, Mode: perf.ModeBW, Column: "series", Placement: placementCross,
			Info: append(b.info("VQ.Push, one request in cq-mod signaled, wait for completions"),
				perf.Field{Key: "TX depth", Value: strconv.Itoa(b.d.txDepth)}, perf.Field{Key: "CQ moderation", Value: strconv.Itoa(b.d.cqMod)}),
			Bandwidth: rows})
		if err != nil {
			return err
		}
	}
	return nil
}

// twoSided: 64 B round trips to the server's echo port; the echo serves
// each block while the side pings.
func (b *dBench) twoSided() error {
	return b.pair("Embedded vs daemon VQ Send ping-pong round trip, 64 B (interleaved)", testDSend, vqTwoSidedSize,
		"full round trips: SEND to the server's bound port, its VQ echoes to the port ours is bound to (the echo waits without spinning)",
		func(s *dSide, w, n int) ([]time.Duration, error) {
			return s.ping.Run(b.ctx, vqTwoSidedSize, w, n, b.d.timeout)
		})
}

// connects: warm Connect latency, embedded (a cached lookup) vs daemon (a
// ring round trip).
func (b *dBench) connects() error {
	dl := rawqp.NewDeadline(b.ctx, b.d.timeout)
	defer dl.Close()
	return b.pair("Embedded vs daemon warm connect latency (interleaved)", testDConnect, 0,
		"VQ.Connect to the server node, already known (warm)",
		func(s *dSide, w, n int) ([]time.Duration, error) {
			samples := make([]time.Duration, 0, n)
			for i := range w + n {
				t0 := time.Now()
				if err := s.cq.Connect(dl.Get(), dNodeServer, nil); err != nil {
					return nil, fmt.Errorf("warm connect #%d: %w", i, err)
				}
				if d := time.Since(t0); i >= w {
					samples = append(samples, d)
				}
			}
			return samples, nil
		})
}

// rates: warm connects per second through the daemon from 1 and from
// -procs client processes, rounds alternating; each figure is the median
// round.
func (b *dBench) rates() error {
	per := b.d.n * 10
	rates := map[int][]float64{}
	for _, round := range [][]int{{1, b.d.procs}, {b.d.procs, 1}, {1, b.d.procs}} {
		for _, procs := range round {
			r, err := b.rate(procs, per)
			if err != nil {
				return fmt.Errorf("connects/s, %d processes: %w", procs, err)
			}
			rates[procs] = append(rates[procs], r)
		}
	}
	b.out.AddFigures(
		perf.Figure("connects/s through the daemon, 1 client process (median of 3 rounds)", median(rates[1])/1e6, " M/s"),
		perf.Figure(fmt.Sprintf("connects/s through the daemon, %d client processes (median of 3 rounds)", b.d.procs), median(rates[b.d.procs])/1e6, " M/s"))
	return nil
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// rate runs procs connector processes of n warm connects each and returns
// the connects per second from go to the last one's finish.
func (b *dBench) rate(procs, n int) (float64, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.d.timeout)
	defer cancel()
	type kid struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Reader
	}
	var kids []kid
	defer func() {
		for _, k := range kids {
			k.in.Close()
			k.cmd.Process.Kill()
			k.cmd.Wait()
		}
	}()
	for range procs {
		cmd := exec.CommandContext(ctx, exe, childConnex, b.sock, strconv.Itoa(dNodeServer), strconv.Itoa(n))
		cmd.Stderr = b.stderr
		setChildAttrs(cmd)
		in, err := cmd.StdinPipe()
		if err != nil {
			return 0, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		kids = append(kids, kid{cmd, in, bufio.NewReader(out)})
	}
	for _, k := range kids {
		if line, err := k.out.ReadString('\n'); err != nil || line != "ready\n" {
			return 0, fmt.Errorf("connector process: %q %v", line, err)
		}
	}
	t0 := time.Now()
	for _, k := range kids {
		io.WriteString(k.in, "go\n")
	}
	for _, k := range kids {
		if line, err := k.out.ReadString('\n'); err != nil || line != "done\n" {
			return 0, fmt.Errorf("connector process: %q %v", line, err)
		}
	}
	return float64(procs*n) / time.Since(t0).Seconds(), nil
}
