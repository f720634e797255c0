package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"

	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/bench/report"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/verbs"
)

// runClientCmd is -client: run the suite against a server.
func runClientCmd(ctx context.Context, cfg *config, stdout, stderr io.Writer) error {
	out := newOutput(cfg, stdout)
	if err := runSuite(ctx, cfg, cfg.server, cfg.fabricFor(ctx), out, stderr); err != nil {
		return err
	}
	return out.Finish(cfg.check)
}

// runInproc is -inproc: a server session in a goroutine, on an in-memory
// fabric shared with the client. The control connection is still loopback
// TCP, so both halves run exactly the code they run across processes.
func runInproc(ctx context.Context, cfg *config, stdout, stderr io.Writer) error {
	out := newOutput(cfg, stdout)
	if err := runInprocSuite(ctx, cfg, out, stderr); err != nil {
		return err
	}
	return out.Finish(cfg.check)
}

func runInprocSuite(ctx context.Context, cfg *config, out *report.Output, stderr io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("inproc control listener: %w", err)
	}
	fab := newMemFabric()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	scfg := *cfg
	scfg.bind = "127.0.0.1"
	served := make(chan error, 1)
	logf := func(string, ...any) {} // its errors reach the client's replies
	if cfg.verbose {
		logf = func(format string, a ...any) { fmt.Fprintf(stderr, "krbench inproc server: "+format+"\n", a...) }
	}
	go func() { served <- serve(ctx, &scfg, fab, nil, ln, true, logf) }()
	err = runSuite(ctx, cfg, ln.Addr().String(), fab, out, stderr)
	if err != nil {
		cancel()
	}
	// The session ends with the client's bye (or the cancel above); the
	// wait is bounded by the session's own timeouts.
	if serr := <-served; err == nil && serr != nil && ctx.Err() == nil {
		err = fmt.Errorf("inproc server: %w", serr)
	}
	return err
}

// client is the side that drives a session.
type client struct {
	ctx  context.Context
	cfg  *config
	ctl  *control.Conn
	dev  verbs.Device
	host string // the server's host, for the raw baseline connection
	out  *report.Output
	logf func(string, ...any)

	place     string // placement of the two sides
	fabricIn  string // "client-addr <-> server-addr"
	transport string // "soft RC", "ibverbs RC"

	stderr io.Writer // where the runtimes' warnings go
}

// runSuite connects to the server at addr and runs cfg's tests.
func runSuite(ctx context.Context, cfg *config, addr string, fab fabric, out *report.Output, stderr io.Writer) (err error) {
	logf := func(string, ...any) {}
	if cfg.verbose {
		logf = func(format string, a ...any) { fmt.Fprintf(stderr, "krbench: "+format+"\n", a...) }
	}
	d := net.Dialer{Timeout: cfg.timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("connect to server %s: %w", addr, err)
	}
	host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
	c := &client{ctx: ctx, cfg: cfg, ctl: control.NewConn(ctx, conn), host: host, out: out, logf: logf, place: fab.placement(),
		transport: fab.transport(), stderr: stderr}
	defer c.ctl.Close()

	c.dev, err = fab.newNode("client")
	if err != nil {
		return err
	}
	defer func() {
		if cerr := c.dev.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close client RNIC: %w", cerr)
		}
	}()
	hello, err := c.ctl.Call(&control.Msg{Op: control.OpHello, Version: control.Version, Node: fab.describe(c.dev), Fabric: fab.placement()}, cfg.timeout)
	if err != nil {
		return fmt.Errorf("hello to %s: %w", addr, err)
	}
	c.fabricIn = fmt.Sprintf("%s <-> %s", fab.describe(c.dev), hello.Node)
	logf("connected to %s (%s)", addr, c.fabricIn)

	for _, t := range cfg.tests {
		var err error
		switch t {
		case testRaw:
			err = c.runRaw()
		case testConnect:
			if err = c.runConnect(); err == nil {
				err = c.runKrConnect()
			}
		case testVQ:
			err = c.runVQ()
		case testMesh:
			err = runMesh(ctx, cfg, out, stderr, logf)
		case testCluster:
			err = runCluster(ctx, cfg, out, stderr, logf)
		case testImm:
			err = runImm(ctx, cfg, out, stderr, logf)
		default:
			for _, m := range cfg.modesOf(t) {
				if err = c.runTest(t, m); err != nil {
					break
				}
			}
		}
		if err != nil {
			return err
		}
	}
	if cfg.baseline {
		if err := c.runPaired(); err != nil {
			return err
		}
	}
	if _, err := c.ctl.Call(&control.Msg{Op: control.OpBye}, cfg.timeout); err != nil {
		return fmt.Errorf("bye: %w", err)
	}
	return nil
}

// Titles follow perftest's.
var titles = map[string]string{
	testRead + modeLat: "RDMA_Read Latency Test", testRead + modeBW: "RDMA_Read BW Test",
	testWrite + modeLat: "RDMA_Write Latency Test", testWrite + modeBW: "RDMA_Write BW Test",
	testSend + modeLat: "Send Latency Test", testSend + modeBW: "Send BW Test",
	testRaw + modeLat: "TCP ping-pong Latency Test (baseline)", testRaw + modeBW: "TCP stream BW Test (baseline)",
}

func (c *client) atomicName() string {
	if c.cfg.atomicOp == "cas" {
		return "CMP_AND_SWAP"
	}
	return "FETCH_AND_ADD"
}

func (c *client) title(test, mode string) string {
	if test == testAtomic {
		if mode == modeLat {
			return "Atomic " + c.atomicName() + " Latency Test"
		}
		return "Atomic " + c.atomicName() + " BW Test"
	}
	return titles[test+mode]
}

// runTest runs one RDMA test in one mode over every size.
func (c *client) runTest(test, mode string) (err error) {
	cfg := c.cfg
	sizes := c.fitSizes(test, mode)
	if len(sizes) == 0 {
		return nil
	}
	r, err := c.openRunMem(test, mode, slices.Max(sizes), cfg.inlineMax(), true)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := c.closeRun(r); cerr != nil && err == nil {
			err = fmt.Errorf("%s %s: %w", test, mode, cerr)
		}
	}()
	ep, p := r.ep, r.p
	res := perf.Result{Title: c.title(test, mode), Test: test, Mode: perf.Mode(mode), Placement: c.place, Info: c.info(test, mode)}
	for _, size := range sizes {
		iters, warmup := cfg.iters(mode, size)
		c.logf("%s %s: %d B x %d (+%d warm-up)", test, mode, size, iters, warmup)
		spec := rawqp.Spec{Op: opcode(test, cfg.atomicOp), Size: size, Remote: r.mr}
		if test == testAtomic {
			size, spec.Size = 8, 8
			spec.Cmp = 1 // FAA adds 1; CAS compares with 1 (and mostly fails, which costs the same)
		}
		if mode == modeLat {
			samples, err := c.latencyRun(ep, p, test, spec, warmup, iters)
			if err != nil {
				return err
			}
			res.Latency = append(res.Latency, perf.Latency(size, samples))
			continue
		}
		marks, err := c.bandwidthRun(ep, p, test, spec, warmup, iters)
		if err != nil {
			return err
		}
		res.Bandwidth = append(res.Bandwidth, perf.Bandwidth(size, marks, cfg.txDepth))
	}
	return c.out.Add(res)
}

// firstErr is err, or later if err is nil: when a run and then its cleanup
// fail, the run's error is the one worth reporting.
func firstErr(err, later error) error {
	if err != nil {
		return err
	}
	return later
}

// info is the preamble of an RDMA table.
// serverMR says where the perftest-style tests' target memory lies.
const serverMR = "a memfd (offheap.AllocShared): the shm link READs and WRITEs it in place"

func (c *client) info(test, mode string) []perf.Field {
	cfg := c.cfg
	f := []perf.Field{
		{Key: "Transport", Value: c.transport},
		{Key: "Fabric", Value: c.fabricIn},
		{Key: "Server MR", Value: serverMR},
	}
	if mode == modeLat {
		how := "post to completion, one request at a time"
		if test == testSend {
			how = "half the round trip of a SEND ping-pong (as ib_send_lat)"
		}
		f = append(f, perf.Field{Key: "Latency", Value: how})
	} else {
		f = append(f, perf.Field{Key: "TX depth", Value: strconv.Itoa(cfg.txDepth)},
			perf.Field{Key: "CQ moderation", Value: strconv.Itoa(cfg.cqMod)})
	}
	if test == testSend {
		f = append(f, perf.Field{Key: "RX depth", Value: strconv.Itoa(cfg.rxDepth)})
	}
	if test == testSend || test == testWrite {
		f = append(f, perf.Field{Key: "Max inline", Value: strconv.Itoa(min(cfg.inlineMax(), c.dev.Attr().MaxInline)) + " B"})
	}
	return append(f, perf.Field{Key: "CQ polling", Value: c.polling()})
}

func (c *client) polling() string {
	spin := c.cfg.spinFor(c.place)
	if spin == 0 {
		return "blocking wait (timeout " + perf.DurationText(c.cfg.timeout) + ")"
	}
	return "spin " + perf.DurationText(spin) + ", then blocking wait (timeout " + perf.DurationText(c.cfg.timeout) + ")"
}
