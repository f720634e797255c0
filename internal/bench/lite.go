package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/rpc"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/krcore/krcore"
	krclient "github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/bench/report"
	"github.com/krcore/krcore/internal/bench/vqrun"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// krbench lite measures package lite against the krcore operations it is
// built from, embedded and through krcored, in one process and across
// processes, every ratio from series run in rotating blocks of one run:
//
//	krbench lite [-places inproc,cross] [-tests read,rpc,memcpy,barrier,lock] [-n N] [-spin D] [-timeout D] [-json] [-check]
//
// In one process the master is node 2 of a 3-node in-memory cluster, the
// embedded mapper node 1 and krcored (served in this process) node 3.
// Across processes the master is a child process (this binary's
// lite-server role, node 101, with the MetaServer), the embedded mapper a
// soft node here (102) and krcored a child process (103), over the soft
// link between processes of one host (shared memory unless
// KRCORE_SOFT_LINK=tcp). The master mallocs an LMR and exports a plain region beside it on
// the same node; each mapper maps the LMR and connects a VQ to the region.
//
// Series, embedded and through krcored (*_daemon):
//
//   - lite-read: an 8 B lite Read through a handle (lmr) and an 8 B READ
//     pushed on a VQ to the same node (vq), both waiting as lite does (the
//     runtime's PopWait). Target: lmr / vq <= 1.1 (issue 15), each way
//     and each placement.
//   - lite-memcpy: 1 MiB copied from one LMR to another of the master by
//     Memcpy, executed at the master's node (memcpy), and by a Read of
//     the source into the caller and a Write of it to the destination
//     (read_write). No target: the ratio is reported.
//   - lite-rpc (literpc.go, literaw.go): 8 B lite RPC round trips against
//     a raw-QP SEND round trip (embedded) and a VQ SEND round trip between
//     the same nodes, and Go net/rpc between the same processes; lite RPC
//     calls/s from 1 and 8 callers.
//
//   - lock hand-off (litelock.go, across processes): a lite Lock of the
//     master taken and released in a loop by this process and a locker
//     child process at once; the time per hand-off, beside one process
//     alone.
//   - barrier (litebarrier.go): 8 goroutines of one side's Node meet at a
//     lite Barrier of the master, generation after generation; the time
//     per generation, each way and each placement.

// Names of the lite benchmark.
const (
	testLiteRead    = "lite-read"
	testLiteMemcpy  = "lite-memcpy"
	seriesLMR       = "lmr"
	seriesMemcpy    = "memcpy"
	seriesReadWrite = "read_write"
	liteLMRName     = "krbench-lite"
	liteRawName     = "krbench-lite-raw"
	liteSrcName     = "krbench-lite-src"
	liteDstName     = "krbench-lite-dst"
	liteRegionSize  = 4096
	liteReadSize    = 8
	liteCopySize    = 1 << 20
	childLiteServer = "lite-server"
	// An LMR Read is a VQ READ behind a handle lookup and a bounce copy.
	targetLMRVsVQRead = 1.1
)

// liteDeviation says where the run measures other than the issue asks.
const liteDeviation = "through krcored, a lite RPC (rpc_daemon) is compared with a VQ SEND round trip (vq_send_daemon), not a raw QP's: krcored's RNIC is another process's"

// liteTests are the names -tests takes, in the order they run.
var liteTests = []string{"read", "rpc", "memcpy", "barrier", "lock"}

// liteConfig is krbench lite's command line.
type liteConfig struct {
	places        []string        // placements, in order
	tests         map[string]bool // of liteTests
	n             int
	spin, timeout time.Duration
	json, check   bool
	prof          config // cpuProfile and traceFile: this process's profiles
}

func parseLite(args []string, stderr io.Writer) (*liteConfig, error) {
	fs := flag.NewFlagSet("krbench lite", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &liteConfig{tests: map[string]bool{}}
	places := fs.String("places", "inproc,cross", "placements to measure: inproc (one process), cross (child processes, the soft link between them)")
	tests := fs.String("tests", strings.Join(liteTests, ","), "tests to run: read, rpc, memcpy, barrier, lock (lock: across processes only)")
	fs.IntVar(&c.n, "n", 2000, "iterations per latency series")
	fs.DurationVar(&c.spin, "spin", 200*time.Microsecond, "how long krcored's pump polls before it sleeps")
	fs.DurationVar(&c.timeout, "timeout", time.Minute, "bound on every wait")
	fs.BoolVar(&c.json, "json", false, "one JSON document")
	fs.BoolVar(&c.check, "check", false, "exit with status 3 when a target is missed")
	fs.StringVar(&c.prof.cpuProfile, "cpuprofile", "", "write this process's CPU profile to `file` (go tool pprof)")
	fs.StringVar(&c.prof.traceFile, "trace", "", "write this process's execution trace to `file` (go tool trace)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if c.n < interleave.Blocks || fs.NArg() > 0 {
		return nil, fmt.Errorf("-n >= %d, no arguments", interleave.Blocks)
	}
	for _, p := range strings.Split(*places, ",") {
		place, ok := smcPlaces[p]
		if !ok || p == "tcp" || slices.Contains(c.places, place) {
			return nil, fmt.Errorf("-places: %q is not one of inproc, cross (each once)", p)
		}
		c.places = append(c.places, place)
	}
	for _, t := range strings.Split(*tests, ",") {
		if !slices.Contains(liteTests, t) || c.tests[t] {
			return nil, fmt.Errorf("-tests: %q is not one of %s (each once)", t, strings.Join(liteTests, ", "))
		}
		c.tests[t] = true
	}
	return c, nil
}

// runLiteCmd is krbench lite.
func runLiteCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseLite(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "krbench lite: %v\n", err)
		return 2
	}
	stop, err := startProfiles(&c.prof)
	defer stop()
	if err != nil {
		fmt.Fprintf(stderr, "krbench lite: %v\n", err)
		return 2
	}
	b := &liteBench{c: c, ctx: ctx, stderr: stderr, out: report.New(stdout, c.json, deriveLiteChecks)}
	for _, place := range c.places {
		if err == nil && place == placementInproc {
			err = b.inproc()
		}
		if err == nil && place == placementCross {
			err = b.cross()
		}
	}
	if err == nil {
		err = b.out.Finish(c.check)
	}
	return cmdStatus(stderr, "lite", err)
}

// liteBench is one krbench lite run.
type liteBench struct {
	c      *liteConfig
	ctx    context.Context
	stderr io.Writer
	out    *report.Output
}

// liteSide is one mapper: embedded or through krcored.
type liteSide struct {
	suffix  string // of its series' labels
	api     krcore.API
	node    *lite.Node
	h       lite.Handle
	src     lite.Handle // liteCopySize bytes each, Read|Write
	dst     lite.Handle
	buf     []byte // the read_write series' bounce through the caller
	ping    *vqrun.Ping
	netrpc  *rpc.Client // the embedded side's, as are raw and rawPoll
	raw     *rawqp.Endpoint
	rawPoll *rawqp.Poller
	q       krcore.VQ // connected to the master's node
	g       krcore.Region
	local   krcore.MR
}

// open maps the master's LMR and connects a VQ to its plain region.
func (s *liteSide) open(ctx context.Context, master krcore.NodeID) error {
	var err error
	if s.node, err = lite.Open(ctx, s.api, lite.Options{}); err != nil {
		return err
	}
	for _, m := range []struct {
		h    *lite.Handle
		name string
	}{{&s.h, liteLMRName}, {&s.src, liteSrcName}, {&s.dst, liteDstName}} {
		if *m.h, err = s.node.Map(ctx, master, m.name, lite.Read|lite.Write); err != nil {
			return err
		}
	}
	s.buf = make([]byte, liteCopySize)
	if s.local, err = s.api.RegMR(liteRegionSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	if s.q, err = s.api.Queue(); err != nil {
		return err
	}
	if err = s.q.Connect(ctx, master, nil); err != nil {
		return err
	}
	s.g, err = s.q.Region(ctx, liteRawName)
	return err
}

func (s *liteSide) close() {
	s.closeRaw()
	if s.ping != nil {
		s.ping.Close()
	}
	if s.netrpc != nil {
		s.netrpc.Close()
	}
	if s.node != nil {
		s.node.Close()
	}
	if s.q != nil {
		s.q.Close()
	}
	if s.local != nil {
		s.api.Deregister(s.local)
	}
}

// liteMaster makes the master's LMRs (the one lite-read reads, and
// lite-memcpy's source, filled with copyPattern, and destination) and,
// beside them on the same node, the plain region the VQ baseline READs,
// and the lite-rpc series' echo servers (startEchoes; rpcAddr is the Go
// net/rpc one's); stop releases them.
func liteMaster(ctx context.Context, api krcore.API, dev verbs.Device) (stop func(), rpcAddr string, err error) {
	n, err := lite.Open(ctx, api, lite.Options{})
	if err != nil {
		return nil, "", err
	}
	var echoes *liteEchoes
	raw, err := api.RegMR(liteRegionSize, verbs.AccessAll)
	for _, m := range []struct {
		name string
		size int
	}{{liteLMRName, liteRegionSize}, {liteSrcName, liteCopySize}, {liteDstName, liteCopySize}} {
		var l *lite.LMR
		if err == nil {
			l, err = n.Malloc(ctx, m.name, m.size, lite.Read|lite.Write)
		}
		if err == nil && m.name == liteSrcName {
			copyPattern(l.Bytes())
		}
	}
	if err == nil {
		err = api.Export(liteRawName, raw, 0, liteRegionSize, verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
	}
	if err == nil {
		echoes, err = startEchoes(api, dev, n)
	}
	if err == nil {
		_, err = n.NewLock(ctx, liteLockName) // freed by n.Close
	}
	stop = func() {
		if echoes != nil {
			echoes.close()
		}
		n.Close()
		if raw != nil {
			api.Unexport(liteRawName)
			api.Deregister(raw)
		}
	}
	if err != nil {
		stop()
		return nil, "", fmt.Errorf("lite master: %w", err)
	}
	return stop, echoes.ln.Addr().String(), nil
}

// inproc measures in one process: a 3-node in-memory cluster, krcored
// served here on node 3.
func (b *liteBench) inproc() error {
	ctx, cancel := context.WithTimeout(b.ctx, b.c.timeout)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 3, Runtime: core.Config{Logger: slogTo(b.stderr)}})
	if err != nil {
		return fmt.Errorf("in-process cluster: %w", err)
	}
	defer c.Close()
	stop, rpcAddr, err := liteMaster(ctx, core.Embed(c.Node(2)), c.Devices[1])
	if err != nil {
		return err
	}
	defer stop()
	cl, stopDaemon, err := b.serveDaemon(ctx, c.Node(3))
	if err != nil {
		return err
	}
	defer stopDaemon()
	sides := []*liteSide{{api: core.Embed(c.Node(1))}, {suffix: daemonSuffix, api: cl}}
	return b.measure(ctx, placementInproc, 2, rpcAddr, c.Devices[0], sides,
		"master node 2, embedded mapper node 1, krcored (served in this process) node 3; in-memory fabric", nil)
}

// serveDaemon serves krcored on rt in this process and attaches to it.
func (b *liteBench) serveDaemon(ctx context.Context, rt *core.Runtime) (*krclient.Client, func(), error) {
	dir, err := os.MkdirTemp("", "krbench-lite")
	if err != nil {
		return nil, nil, err
	}
	sock := filepath.Join(dir, "krcored.sock")
	srv, err := daemon.New(rt, daemon.Config{Socket: sock, Spin: b.c.spin, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	stop := func() { srv.Close(); <-done; os.RemoveAll(dir) }
	cl, err := krclient.Attach(ctx, krclient.Options{Socket: sock, CallTimeout: b.c.timeout})
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("attach krcored: %w", err)
	}
	return cl, func() { cl.Close(); stop() }, nil
}

// cross measures across processes: the master and krcored in child
// processes, the embedded mapper here.
func (b *liteBench) cross() (err error) {
	ctx, cancel := context.WithTimeout(b.ctx, b.c.timeout)
	defer cancel()
	d := &dBench{d: &dConfig{timeout: b.c.timeout, spin: b.c.spin}, ctx: b.ctx, log: slogTo(b.stderr), stderr: b.stderr, role: childLiteServer}
	defer func() { err = firstErr(err, d.close()) }()
	info, err := d.startServer(ctx, nil)
	if err != nil {
		return fmt.Errorf("lite master process: %w", err)
	}
	if d.emb, err = d.node(ctx, dNodeEmbedded, []meta.Info{info}); err != nil {
		return err
	}
	if err := d.startDaemon(ctx, info); err != nil {
		return err
	}
	line, err := d.serverOut.ReadString('\n')
	if err != nil {
		return fmt.Errorf("lite master process: its net/rpc address: %w", err)
	}
	sides := []*liteSide{{api: core.Embed(d.emb)}, {suffix: daemonSuffix, api: d.cl}}
	return b.measure(ctx, placementCross, dNodeServer, strings.TrimSpace(line), d.devs[0], sides, fmt.Sprintf(
		"master node %d: a child process; embedded mapper node %d in this process; krcored node %d: a child process; soft RNICs over the link between processes of one host (shared memory; TCP with KRCORE_SOFT_LINK=tcp)",
		dNodeServer, dNodeEmbedded, dNodeDaemon), func() error {
		lctx, cancel := context.WithTimeout(b.ctx, b.c.timeout)
		defer cancel()
		return b.lockHandoffs(lctx, info, sides[0])
	})
}

// measure opens the sides on master and runs the series, then more (if
// any) while the sides are open.
func (b *liteBench) measure(ctx context.Context, place string, master krcore.NodeID, rpcAddr string, dev verbs.Device, sides []*liteSide, nodes string, more func() error) error {
	for _, s := range sides {
		defer s.close()
		if err := errors.Join(s.open(ctx, master), s.openRPC(ctx, master, rpcAddr, dev, b.c.timeout)); err != nil {
			return fmt.Errorf("%s mapper%s: %w", place, s.suffix, err)
		}
	}
	dl := rawqp.NewDeadline(b.ctx, b.c.timeout)
	defer dl.Close()
	t := b.c.tests
	if t["read"] {
		if err := b.reads(dl, place, sides, nodes); err != nil {
			return err
		}
	}
	if t["rpc"] {
		if err := b.rpcs(dl, place, master, sides, nodes); err != nil {
			return err
		}
	}
	if t["memcpy"] {
		if err := b.copies(dl, place, sides, nodes); err != nil {
			return err
		}
	}
	if t["barrier"] {
		bctx, cancel := context.WithTimeout(b.ctx, b.c.timeout)
		defer cancel()
		if err := b.barriers(bctx, place, master, sides); err != nil {
			return err
		}
	}
	if !t["lock"] || more == nil {
		return nil
	}
	return more()
}

// reads is the lite-read table: 8 B through a handle vs a VQ READ.
func (b *liteBench) reads(dl *rawqp.Deadline, place string, sides []*liteSide, nodes string) error {
	var series []*interleave.Latency
	var labels []string
	for _, s := range sides {
		req := krcore.Request{Op: verbs.OpRead, Local: s.local.Range(0, liteReadSize), Remote: s.g.At(0)}
		series = append(series,
			&interleave.Latency{Run: func(w, n int) ([]time.Duration, error) {
				buf := make([]byte, liteReadSize)
				return timed(dl, w, n, func(ctx context.Context) error { return s.node.Read(ctx, s.h, 0, buf) })
			}},
			&interleave.Latency{Run: func(w, n int) ([]time.Duration, error) {
				return vqrun.Latency(dl, s.q, vqrun.Poll{}, req, w, n)
			}})
		labels = append(labels, seriesLMR+s.suffix, seriesVQ+s.suffix)
	}
	return b.rotate(place, testLiteRead, "LITE LMR Read vs VQ READ Latency, 8 B (interleaved)", liteReadSize, b.c.n, series, labels, []perf.Field{
		{Key: "Series", Value: "lmr: lite Node.Read through a handle; vq: VQ.Push of a READ to a region on the same node, then PopWait (as lite waits); *_daemon: through krcored"},
		{Key: "Nodes", Value: nodes},
	})
}

// rotate warms and runs latency series in rotating blocks and adds their
// table, one row per label.
func (b *liteBench) rotate(place, test, title string, size, iters int, series []*interleave.Latency, labels []string, info []perf.Field) error {
	if err := interleave.WarmLatency(max(iters/10, 1), series...); err != nil {
		return fmt.Errorf("%s %s: %w", place, test, err)
	}
	blocks := make([]func() error, len(series))
	for i, s := range series {
		blocks[i] = s.Block(interleave.PerBlock(iters))
	}
	if err := interleave.Rotate(blocks...); err != nil {
		return fmt.Errorf("%s %s: %w", place, test, err)
	}
	rows := make([]perf.LatencyStats, len(series))
	for i, s := range series {
		rows[i] = perf.Latency(size, s.Samples)
		rows[i].Label = labels[i]
	}
	info = append(info,
		perf.Field{Key: "Blocks", Value: fmt.Sprintf("%d per series, rotating order", interleave.Blocks)},
		perf.Field{Key: "Deviation", Value: liteDeviation})
	return b.out.Add(perf.Result{Title: title, Test: test, Mode: perf.ModeLat, Column: "series", Placement: place, Info: info, Latency: rows})
}

// copies is the lite-memcpy table: 1 MiB copied at the master's node vs
// through the caller. Each side checks one copy of each kind first.
func (b *liteBench) copies(dl *rawqp.Deadline, place string, sides []*liteSide, nodes string) error {
	var series []*interleave.Latency
	var labels []string
	for _, s := range sides {
		if err := s.checkCopies(dl); err != nil {
			return fmt.Errorf("%s %s%s: %w", place, testLiteMemcpy, s.suffix, err)
		}
		series = append(series,
			&interleave.Latency{Run: func(w, n int) ([]time.Duration, error) { return timed(dl, w, n, s.memcpy) }},
			&interleave.Latency{Run: func(w, n int) ([]time.Duration, error) { return timed(dl, w, n, s.readWrite) }})
		labels = append(labels, seriesMemcpy+s.suffix, seriesReadWrite+s.suffix)
	}
	return b.rotate(place, testLiteMemcpy, "LITE Memcpy at the master vs Read+Write through the caller, 1 MiB (interleaved)",
		liteCopySize, max(b.c.n/10, interleave.Blocks), series, labels, []perf.Field{
			{Key: "Series", Value: "memcpy: Node.Memcpy between two LMRs of the master, done at its node; read_write: Node.Read of the source into the caller, then Node.Write to the destination; *_daemon: through krcored"},
			{Key: "Nodes", Value: nodes},
		})
}

// memcpy copies the source LMR to the destination at the master's node.
func (s *liteSide) memcpy(ctx context.Context) error {
	return s.node.Memcpy(ctx, s.dst, 0, s.src, 0, liteCopySize)
}

// readWrite copies the source LMR to the destination through the caller.
func (s *liteSide) readWrite(ctx context.Context) error {
	if err := s.node.Read(ctx, s.src, 0, s.buf); err != nil {
		return err
	}
	return s.node.Write(ctx, s.dst, 0, s.buf)
}

// checkCopies runs one copy of each kind, clearing the destination before
// each, and checks the destination holds the source's bytes after it.
func (s *liteSide) checkCopies(dl *rawqp.Deadline) error {
	want := make([]byte, liteCopySize)
	copyPattern(want)
	for _, c := range []struct {
		name string
		run  func(context.Context) error
	}{{seriesMemcpy, s.memcpy}, {seriesReadWrite, s.readWrite}} {
		if err := s.node.Memset(dl.Get(), s.dst, 0, liteCopySize, 0); err != nil {
			return err
		}
		if err := c.run(dl.Get()); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		got := make([]byte, liteCopySize)
		if err := s.node.Read(dl.Get(), s.dst, 0, got); err != nil {
			return err
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("%s: the destination does not hold the source's bytes", c.name)
		}
	}
	return nil
}

// copyPattern fills b with the bytes lite-memcpy's source holds.
func copyPattern(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + i>>12)
	}
}

// timed times warmup+iters runs of op and returns the last iters. Each
// run's context comes from dl before the clock starts, as in the VQ
// series (vqrun.Latency): renewing it reads the clock, which is no cost
// of the operation.
func timed(dl *rawqp.Deadline, warmup, iters int, op func(context.Context) error) ([]time.Duration, error) {
	samples := make([]time.Duration, 0, iters)
	for i := range warmup + iters {
		ctx := dl.Get()
		t0 := time.Now()
		if err := op(ctx); err != nil {
			return nil, fmt.Errorf("#%d: %w", i, err)
		}
		if d := time.Since(t0); i >= warmup {
			samples = append(samples, d)
		}
	}
	return samples, nil
}
