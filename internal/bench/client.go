package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// output collects a run's tables: printed as each finishes (so a long -a
// run shows progress), or kept for one JSON document at the end.
type output struct {
	json  bool
	w     io.Writer
	rep   perf.Report
	extra []perf.Check // figures measured outside the tables (krbench daemon's connects/s)
}

func newOutput(cfg *config, w io.Writer) *output {
	host, _ := os.Hostname()
	return &output{json: cfg.json, w: w, rep: perf.Report{
		Tool: "krbench",
		Info: []perf.Field{
			{Key: "host", Value: host},
			{Key: "go", Value: runtime.Version()},
			{Key: "gomaxprocs", Value: strconv.Itoa(runtime.GOMAXPROCS(0))},
			{Key: "started", Value: time.Now().UTC().Format(time.RFC3339)},
		},
	}}
}

func (o *output) add(r perf.Result) error {
	o.rep.Results = append(o.rep.Results, r)
	if o.json {
		return nil
	}
	return r.WriteText(o.w)
}

// finish derives the checks and prints them (or the whole JSON report). It
// returns errTargetMissed if check is set and a target was missed.
func (o *output) finish(check bool) error {
	o.rep.Checks = append(append(deriveChecks(&o.rep), deriveDaemonChecks(&o.rep)...), o.extra...)
	var err error
	if o.json {
		err = o.rep.WriteJSON(o.w)
	} else {
		err = (&perf.Report{Checks: o.rep.Checks}).WriteText(o.w)
	}
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if check {
		for _, c := range o.rep.Checks {
			if c.Met != nil && !*c.Met {
				return fmt.Errorf("%w: %s = %.2f%s, target %s", errTargetMissed, c.Name, c.Value, c.Unit, c.Target)
			}
		}
	}
	return nil
}

// runClientCmd is -client: run the suite against a server.
func runClientCmd(ctx context.Context, cfg *config, stdout, stderr io.Writer) error {
	out := newOutput(cfg, stdout)
	if err := runSuite(ctx, cfg, cfg.server, cfg.fabricFor(ctx), out, stderr); err != nil {
		return err
	}
	return out.finish(cfg.check)
}

// runInproc is -inproc: a server session in a goroutine, on an in-memory
// fabric shared with the client. The control connection is still loopback
// TCP, so both halves run exactly the code they run across processes.
func runInproc(ctx context.Context, cfg *config, stdout, stderr io.Writer) error {
	out := newOutput(cfg, stdout)
	if err := runInprocSuite(ctx, cfg, out, stderr); err != nil {
		return err
	}
	return out.finish(cfg.check)
}

func runInprocSuite(ctx context.Context, cfg *config, out *output, stderr io.Writer) error {
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
	ctl  *ctrl
	dev  verbs.Device
	host string // the server's host, for the raw baseline connection
	out  *output
	logf func(string, ...any)

	place     string // placement of the two sides
	fabricIn  string // "client-addr <-> server-addr"
	transport string // "soft RC", "ibverbs RC"

	stderr io.Writer // where the runtimes' warnings go
}

// runSuite connects to the server at addr and runs cfg's tests.
func runSuite(ctx context.Context, cfg *config, addr string, fab fabric, out *output, stderr io.Writer) (err error) {
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
	c := &client{ctx: ctx, cfg: cfg, ctl: newCtrl(ctx, conn), host: host, out: out, logf: logf, place: fab.placement(),
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
	hello, err := c.ctl.call(&msg{Op: opHello, Version: protocolVersion, Node: fab.describe(c.dev), Fabric: fab.placement()}, cfg.timeout)
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
	if _, err := c.ctl.call(&msg{Op: opBye}, cfg.timeout); err != nil {
		return fmt.Errorf("bye: %w", err)
	}
	return nil
}

// sizes lists the message sizes a test runs in a mode.
func (cfg *config) sizes(test, mode string) []int {
	switch {
	case test == testAtomic:
		return []int{8}
	case cfg.all:
		var s []int
		for n := 2; n <= maxSize; n *= 2 {
			s = append(s, n)
		}
		return s
	case cfg.size > 0:
		return []int{cfg.size}
	case mode == modeLat:
		return []int{8}
	}
	return []int{64 << 10}
}

// Byte budgets that bound the default iteration counts, so -a finishes in
// reasonable time on the soft fabric.
const (
	latBudget = 256 << 20
	bwBudget  = 512 << 20
)

// iters returns the measured iterations and unmeasured warm-up for one
// size. Warm-up absorbs first-touch costs (the fabric link dial, page
// faults, goroutine start-up) that perftest's C does not have.
func (cfg *config) iters(mode string, size int) (iters, warmup int) {
	switch {
	case cfg.n > 0:
		iters = cfg.n
	case mode == modeLat:
		iters = min(1000, max(16, latBudget/size))
	default:
		iters = min(5000, max(16, bwBudget/size))
	}
	if mode == modeLat {
		return iters, min(max(iters/10, 1), 100)
	}
	return iters, min(iters, cfg.txDepth)
}

// inline is the largest payload posted inline: perftest's default of 220 B
// unless -inline says otherwise.
func (cfg *config) inlineMax() int {
	if cfg.inline >= 0 {
		return cfg.inline
	}
	return 220
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
	r, err := c.openRun(test, mode, slices.Max(sizes), cfg.inlineMax())
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
		spec := opSpec{op: opcode(test, cfg.atomicOp), size: size, remote: r.mr}
		if test == testAtomic {
			size, spec.size = 8, 8
			spec.cmp = 1 // FAA adds 1; CAS compares with 1 (and mostly fails, which costs the same)
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
	return c.out.add(res)
}

// setup creates this side's endpoint for a test, inline payloads up to
// inline bytes, has the server create its own, and connects both: the
// out-of-band exchange perftest does. It returns the server's MR.
func (c *client) setup(test, mode string, size, inline int) (_ *endpoint, _ mrInfo, err error) {
	cfg := c.cfg
	fail := func(err error) (*endpoint, mrInfo, error) {
		return nil, mrInfo{}, fmt.Errorf("%s %s setup: %w", test, mode, err)
	}
	sh := qpShape{sendDepth: cfg.txDepth, recvDepth: 1, inline: inline}
	if test == testSend {
		sh.recvDepth = cfg.rxDepth
	}
	ep, err := newEndpoint(c.dev, nil, size, sh)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err != nil {
			ep.close()
		}
	}()
	b, err := marshalEP(ep.qp)
	if err != nil {
		return fail(err)
	}
	rep, err := c.ctl.call(&msg{Op: opSetup, Test: test, Mode: mode, MaxSize: size,
		TxDepth: cfg.txDepth, RxDepth: cfg.rxDepth, Inline: ep.inline, EP: b}, cfg.timeout)
	if err != nil {
		return fail(err)
	}
	remote, err := unmarshalEP(rep.EP)
	if err != nil {
		return fail(err)
	}
	if rep.MR == nil || rep.MR.Len < size {
		return fail(fmt.Errorf("server MR missing or smaller than %d B", size))
	}
	if err := ep.connect(remote); err != nil {
		return fail(err)
	}
	if test == testSend && mode == modeLat {
		// Echoes come back as SENDs; the server sends none before our
		// first SEND, so posting after connecting is in time.
		if err := ep.postRecvs(cfg.rxDepth); err != nil {
			return fail(err)
		}
	}
	return ep, *rep.MR, nil
}

// teardown frees both sides' objects of a test.
func (c *client) teardown(ep *endpoint) error {
	_, err := c.ctl.call(&msg{Op: opTeardown}, c.cfg.timeout)
	return firstErr(err, ep.close())
}

// rdmaRun is a test's connected endpoint, the server's MR it targets and
// a poller on the endpoint's CQ: what every measured RDMA series needs.
type rdmaRun struct {
	ep *endpoint
	mr mrInfo
	p  *poller
}

// openRun is setup plus the poller the client's placement calls for.
func (c *client) openRun(test, mode string, size, inline int) (*rdmaRun, error) {
	ep, mr, err := c.setup(test, mode, size, inline)
	if err != nil {
		return nil, err
	}
	p := newPoller(c.ctx, ep.cq, c.cfg.spinFor(c.place), c.cfg.timeout, c.place)
	return &rdmaRun{ep: ep, mr: mr, p: p}, nil
}

// closeRun stops the poller before both sides' objects go away.
func (c *client) closeRun(r *rdmaRun) error {
	r.p.close()
	return c.teardown(r.ep)
}

// firstErr is err, or later if err is nil: when a run and then its cleanup
// fail, the run's error is the one worth reporting.
func firstErr(err, later error) error {
	if err != nil {
		return err
	}
	return later
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
func (c *client) latencyRun(ep *endpoint, p *poller, test string, spec opSpec, warmup, iters int) ([]time.Duration, error) {
	if test != testSend {
		s, err := ep.latency(p, spec, warmup, iters)
		if err != nil {
			return nil, fmt.Errorf("%s lat: %w", test, err)
		}
		return s, nil
	}
	if err := c.ctl.send(&msg{Op: opRun, Test: test, Mode: modeLat, Size: spec.size, Total: warmup + iters}, c.cfg.timeout); err != nil {
		return nil, err
	}
	samples, err := ep.pingPong(p, spec.size, warmup, iters)
	if err != nil {
		return nil, fmt.Errorf("send lat: %w", err)
	}
	if _, err := c.ctl.reply(opRun, c.cfg.timeout); err != nil {
		return nil, fmt.Errorf("send lat: %w", err)
	}
	for i := range samples {
		samples[i] /= 2
	}
	return samples, nil
}

// bandwidthRun measures one size after a one-window warm-up. For SEND the
// server counts warm-up and measured receives.
func (c *client) bandwidthRun(ep *endpoint, p *poller, test string, spec opSpec, warmup, iters int) ([]perf.Mark, error) {
	cfg := c.cfg
	if test == testSend {
		if err := c.ctl.send(&msg{Op: opRun, Test: test, Mode: modeBW, Size: spec.size, Total: warmup + iters}, cfg.timeout); err != nil {
			return nil, err
		}
	}
	if warmup > 0 {
		if _, err := ep.stream(p, spec, warmup, cfg.txDepth, cfg.cqMod); err != nil {
			return nil, fmt.Errorf("%s bw warm-up: %w", test, err)
		}
	}
	marks, err := ep.stream(p, spec, iters, cfg.txDepth, cfg.cqMod)
	if err != nil {
		return nil, fmt.Errorf("%s bw: %w", test, err)
	}
	if test == testSend {
		if _, err := c.ctl.reply(opRun, cfg.timeout); err != nil {
			return nil, fmt.Errorf("send bw: %w", err)
		}
	}
	return marks, nil
}

// info is the preamble of an RDMA table.
func (c *client) info(test, mode string) []perf.Field {
	cfg := c.cfg
	f := []perf.Field{
		{Key: "Transport", Value: c.transport},
		{Key: "Fabric", Value: c.fabricIn},
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
		return "blocking wait (timeout " + durText(c.cfg.timeout) + ")"
	}
	return "spin " + durText(spin) + ", then blocking wait (timeout " + durText(c.cfg.timeout) + ")"
}

// durText is d.String() in ASCII ("200us", not "200µs"): tables should
// survive any terminal and grep.
func durText(d time.Duration) string { return strings.ReplaceAll(d.String(), "µ", "u") }

// openRaw has the server open its baseline listener and connects to it.
// done closes the connection and tells the server.
func (c *client) openRaw() (rc *rawClient, done func() error, err error) {
	cfg := c.cfg
	rep, err := c.ctl.call(&msg{Op: opRaw}, cfg.timeout)
	if err != nil {
		return nil, nil, fmt.Errorf("tcp baseline: %w", err)
	}
	d := net.Dialer{Timeout: cfg.timeout}
	conn, err := d.DialContext(c.ctx, "tcp", net.JoinHostPort(c.host, strconv.Itoa(rep.Port)))
	if err != nil {
		c.ctl.call(&msg{Op: opRawDone}, cfg.timeout)
		return nil, nil, fmt.Errorf("tcp baseline: connect: %w", err)
	}
	done = func() error {
		conn.Close()
		if _, err := c.ctl.call(&msg{Op: opRawDone}, cfg.timeout); err != nil {
			return fmt.Errorf("tcp baseline: %w", err)
		}
		return nil
	}
	return &rawClient{c: conn, timeout: cfg.timeout}, done, nil
}

// runRaw measures the plain TCP baseline at the sizes the RDMA tests use.
func (c *client) runRaw() (err error) {
	cfg := c.cfg
	rc, done, err := c.openRaw()
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, done()) }()
	conn := rc.c
	info := []perf.Field{
		{Key: "Transport", Value: "Go net.TCPConn, TCP_NODELAY"},
		{Key: "Path", Value: conn.LocalAddr().String() + " <-> " + conn.RemoteAddr().String()},
	}
	for _, mode := range cfg.modesOf(testRaw) {
		res := perf.Result{Title: titles[testRaw+mode], Test: testRaw, Mode: perf.Mode(mode), Placement: c.place, Info: info}
		// The sizes the RDMA tests of this mode use (not atomics' 8 B
		// alone, unless nothing else runs).
		sizes := cfg.sizes(testRead, mode)
		if mode == modeLat {
			res.Info = append(slices.Clip(info), perf.Field{Key: "Latency", Value: "full round trip: write, then read the echo"})
			for _, size := range sizes {
				iters, warmup := cfg.iters(mode, size)
				c.logf("tcp ping-pong: %d B x %d", size, iters)
				s, err := rc.pingPong(size, warmup, iters)
				if err != nil {
					return err
				}
				res.Latency = append(res.Latency, perf.Latency(size, s))
			}
		} else {
			res.Info = append(slices.Clip(info), perf.Field{Key: "BW", Value: "average: until the receiver acknowledges the last byte; peak: from the sender's writes (kernel buffering flatters it)"})
			for _, size := range sizes {
				iters, warmup := cfg.iters(mode, size)
				c.logf("tcp stream: %d B x %d", size, iters)
				if _, err := rc.stream(size, warmup, cfg.cqMod); err != nil {
					return err
				}
				marks, err := rc.stream(size, iters, cfg.cqMod)
				if err != nil {
					return err
				}
				res.Bandwidth = append(res.Bandwidth, perf.Bandwidth(size, marks, cfg.txDepth))
			}
		}
		if err := c.out.add(res); err != nil {
			return err
		}
	}
	return nil
}

// Connect-test phases, in order.
var phases = []string{"create", "exchange", "modify", "first_op", "total"}

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
	buf, err := allocBuf(connSize)
	if err != nil {
		return err
	}
	defer buf.Close()
	samples := make([][]time.Duration, len(phases))
	var first time.Duration
	p := newPoller(c.ctx, nil, cfg.spinFor(c.place), cfg.timeout, c.place)
	defer p.close()
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
	return c.out.add(res)
}

// connectOnce makes, proves and tears down one connection, returning the
// phase durations in phases order.
func (c *client) connectOnce(buf *offheap.Block, p *poller, token uint64) (_ []time.Duration, err error) {
	cfg := c.cfg
	b := buf.Bytes()
	binary.LittleEndian.PutUint64(b, 0)

	t0 := time.Now()
	ep, err := newEndpoint(c.dev, buf, connSize, qpShape{sendDepth: 4, recvDepth: 1})
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	defer func() {
		if cerr := ep.close(); cerr != nil && err == nil {
			err = cerr
		}
		if _, cerr := c.ctl.call(&msg{Op: opConnClose}, cfg.timeout); cerr != nil && err == nil {
			err = cerr
		}
	}()
	epb, err := marshalEP(ep.qp)
	if err != nil {
		return nil, err
	}
	rep, err := c.ctl.call(&msg{Op: opConnCreate, EP: epb, Token: token}, cfg.timeout)
	if err != nil {
		return nil, err
	}
	t2 := time.Now()
	remote, err := unmarshalEP(rep.EP)
	if err != nil {
		return nil, err
	}
	if rep.MR == nil {
		return nil, fmt.Errorf("server sent no MR")
	}
	if err := ep.connect(remote); err != nil {
		return nil, err
	}
	t3 := time.Now()
	p.cq = ep.cq
	if _, err := ep.latency(p, opSpec{op: verbs.OpRead, size: 8, remote: *rep.MR}, 0, 1); err != nil {
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
