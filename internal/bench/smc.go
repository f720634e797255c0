package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/bench/report"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/smc"
	"github.com/krcore/krcore/verbs"
)

// krbench smc measures package smc's connections against Go TCP between
// the same two endpoints, every ratio from series run in rotating blocks
// of one run:
//
//	krbench smc [-places inproc,cross,tcp] [-n N] [-msgs M] [-spin D] [-timeout D] [-json] [-check]
//
// Placements (-places):
//
//   - inproc: one process; the server is node 2 of a 2-node in-memory
//     cluster (embedded), the client node 1, embedded and through krcored
//     (served in the process).
//   - cross (the setting): the server is a child process (this
//     binary's smc-server role, node 101, embedded); the client is this
//     process, embedded (node 102) and through krcored (a child process,
//     node 103), over the soft link between processes of one host
//     (shared memory).
//   - tcp: as cross, with every soft node on the soft RNIC's TCP link,
//     as two hosts' would be.
//
// The TCP baseline is a plain net.Listener and net.Dial on 127.0.0.1
// between the same two processes. Series (smc, smc_daemon, tcp):
//
//   - smc-rtt: an 8 B ping-pong (write 8 B, read the 8 B echo) on one
//     connection. Target (issue 17): SMC <= 0.3x TCP on one host, <= 1.3x
//     over the TCP link.
//   - smc-stream: 64 KiB writes streamed to a sink that acknowledges the
//     last byte; the median block's rate. Target: SMC >= 1.5x TCP on one
//     host, >= 1/1.3x over the TCP link.
//   - smc-connect: a Dial that returns a settled connection (closed
//     untimed after), once the two Nodes already know each other's slabs:
//     a TCP connect plus the CLC round trips. Target: SMC <= 2x TCP.
//   - smc-connect-first: the first connection between two Nodes: a Dial
//     from a Node opened just before (untimed), so both sides register
//     and export a slab for the other and look the other's up. krcore's
//     QPs between the two nodes are pooled already (they are the links).
//     No target.
//   - smc-many: 8 B round trips on 100 active connections at once while
//     1,000 more stay open and idle (16 KiB buffers); every round trip's
//     time. No target: the ratio is reported.

// Names of the smc benchmark.
const (
	testSMCRTT          = "smc-rtt"
	testSMCStream       = "smc-stream"
	testSMCConnect      = "smc-connect"
	testSMCConnectFirst = "smc-connect-first"
	testSMCMany         = "smc-many"
	seriesSMC           = "smc"
	smcPingSize         = 8
	smcStreamSize       = 64 << 10
	// smcBufferSize is the buffer of the Node of each process: 0,
	// adapting (smc.NodeOptions' defaults: 64 KiB, growing for a stream
	// up to smc.DefaultMaxBufferSize), as smc-rtt, smc-stream and
	// smc-connect use it.
	smcBufferSize = 0
	// smcSmallBuffer is the fixed buffer (smc.Options.BufferSize) of
	// smc-many's connections, on the same Node (a second Node's goroutine
	// would wait on its port beside the first's, in every process), and
	// of smc-connect-first's Nodes: many connections, little data each.
	smcSmallBuffer   = 16 << 10
	smcIdle          = 1000
	smcActive        = 100
	childSMCServer   = "smc-server"
	targetSMCRTT     = 0.3
	targetSMCStream  = 1.5
	targetSMCTCPLink = 1.3 // over the TCP link: no worse than TCP by this
	// A later connect is a TCP connect plus one CLC round trip and the
	// confirm (issue 17).
	targetSMCConnect = 2
)

// smcPlaces maps -places' names to placements.
var smcPlaces = map[string]string{"inproc": placementInproc, "cross": placementCross, "tcp": placementCrossTCP}

// smcConfig is krbench smc's command line.
type smcConfig struct {
	places        []string // placements, in order
	n, msgs       int
	spin, timeout time.Duration
	json, check   bool
}

func parseSMC(args []string, stderr io.Writer) (*smcConfig, error) {
	fs := flag.NewFlagSet("krbench smc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &smcConfig{}
	places := fs.String("places", "inproc,cross,tcp", "placements to measure: inproc, cross (two processes, shared-memory link), tcp (two processes, soft TCP link)")
	fs.IntVar(&c.n, "n", 5000, "round trips per latency series")
	fs.IntVar(&c.msgs, "msgs", 4000, "64 KiB writes per stream series")
	fs.DurationVar(&c.spin, "spin", 0, "how long krcored's pump polls before it sleeps (0: krcored's default, the runtime's adaptive few microseconds)")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "bound on each placement's setup, each dial, and each block of round trips or writes")
	fs.BoolVar(&c.json, "json", false, "one JSON document")
	fs.BoolVar(&c.check, "check", false, "exit with status 3 when a target is missed")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if c.n < interleave.Blocks || c.msgs < interleave.Blocks || fs.NArg() > 0 {
		return nil, fmt.Errorf("-n and -msgs >= %d, no arguments", interleave.Blocks)
	}
	for _, p := range strings.Split(*places, ",") {
		place, ok := smcPlaces[p]
		if !ok || slices.Contains(c.places, place) {
			return nil, fmt.Errorf("-places: %q is not one of inproc, cross, tcp (each once)", p)
		}
		c.places = append(c.places, place)
	}
	return c, nil
}

// runSMCCmd is krbench smc.
func runSMCCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseSMC(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "krbench smc: %v\n", err)
		return 2
	}
	out := report.New(stdout, c.json, deriveSMCChecks)
	for _, place := range c.places {
		if err == nil {
			err = runSMC(ctx, c, place, stderr, out)
		}
	}
	if err == nil {
		err = out.Finish(c.check)
	}
	return cmdStatus(stderr, "smc", err)
}

// smcServers is the bench's server side: SMC listeners on a Node with
// large buffers and one with small ones, and a plain TCP listener, all
// serving serveSMCBench.
type smcServers struct {
	smc, small, tcp string // addresses
	close           func()
}

// startSMCServers serves the bench on api's Nodes and on TCP, on loopback.
func startSMCServers(api krcore.API) (*smcServers, error) {
	var closers []func() error
	var servers sync.WaitGroup
	s := &smcServers{close: func() {
		for _, f := range slices.Backward(closers) {
			f()
		}
		servers.Wait()
	}}
	serve := func(opts *smc.Options) (string, error) {
		var ln net.Listener
		var err error
		if opts == nil {
			ln, err = net.Listen("tcp", "127.0.0.1:0")
		} else {
			ln, err = smc.Listen("tcp", "127.0.0.1:0", opts)
		}
		if err != nil {
			return "", err
		}
		closers = append(closers, ln.Close)
		servers.Add(1)
		go func() { defer servers.Done(); serveSMCBench(ln) }()
		return ln.Addr().String(), nil
	}
	n, err := smc.Open(api, smc.NodeOptions{BufferSize: smcBufferSize})
	if err != nil {
		s.close()
		return nil, err
	}
	closers = append(closers, n.Close)
	for _, l := range []struct {
		addr *string
		opts *smc.Options
	}{{&s.smc, &smc.Options{Node: n}}, {&s.small, &smc.Options{Node: n, BufferSize: smcSmallBuffer}}, {&s.tcp, nil}} {
		var err error
		if *l.addr, err = serve(l.opts); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

// runSMCServer is the server process of the cross-process placements:
// startSMCServers on a server node (serveNode); its line is the three
// addresses.
func runSMCServer(ctx context.Context, stdout io.Writer) error {
	return serveNode(ctx, stdout, func(_ context.Context, api krcore.API, _ verbs.Device) (string, func(), error) {
		s, err := startSMCServers(api)
		if err != nil {
			return "", nil, err
		}
		return strings.Join([]string{s.smc, s.small, s.tcp}, " "), s.close, nil
	})
}

// smcAPI is one client runtime: embedded or through krcored.
type smcAPI struct {
	label string
	api   krcore.API
}

// smcSide is one client endpoint: a ping-pong connection and a stream
// connection, over SMC or TCP.
type smcSide struct {
	label        string
	timeout      time.Duration // bound on a dial, and on a block of round trips or writes
	ping, stream net.Conn
	dial         func() (net.Conn, error) // a connection to the sink
	// first opens a Node, dials with it and closes both, timing the dial
	first func() (time.Duration, error)
	many  []net.Conn // to the small server: the active ones first
	nodes []*smc.Node
}

func (s *smcSide) close() {
	for _, c := range append([]net.Conn{s.ping, s.stream}, s.many...) {
		if c != nil {
			c.Close()
		}
	}
	for _, n := range s.nodes {
		n.Close()
	}
}

// runSMC measures one placement. -timeout bounds its setup and each wait
// of the measurement, not the whole: on a loaded machine the tables take
// longer, and a dial late in the run must not fail for the time the
// tables before it took.
func runSMC(ctx context.Context, c *smcConfig, place string, stderr io.Writer, out *report.Output) (err error) {
	setup, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if place == placementInproc {
		cl, err := cluster.Start(setup, cluster.Config{Nodes: 2, Runtime: core.Config{Logger: slogTo(stderr)}})
		if err != nil {
			return fmt.Errorf("in-process cluster: %w", err)
		}
		defer cl.Close()
		lb := &liteBench{c: &liteConfig{spin: c.spin, timeout: c.timeout}}
		daemonAPI, stopDaemon, err := lb.serveDaemon(setup, cl.Node(1))
		if err != nil {
			return err
		}
		defer stopDaemon()
		srv, err := startSMCServers(core.Embed(cl.Node(2)))
		if err != nil {
			return err
		}
		defer srv.close()
		return measureSMC(ctx, c, out, place, srv, []smcAPI{{seriesSMC, core.Embed(cl.Node(1))}, {seriesSMC + daemonSuffix, daemonAPI}},
			"server node 2 (embedded), client node 1 embedded and through krcored (served in this process); in-memory fabric; TCP: loopback")
	}
	d := &dBench{d: &dConfig{timeout: c.timeout, spin: c.spin}, ctx: ctx, log: slogTo(stderr), stderr: stderr,
		role: childSMCServer, tcpLink: place == placementCrossTCP}
	defer func() { err = firstErr(err, d.close()) }()
	info, err := d.startServer(setup, nil)
	if err != nil {
		return fmt.Errorf("smc server process: %w", err)
	}
	if d.emb, err = d.node(setup, dNodeEmbedded, []meta.Info{info}); err != nil {
		return err
	}
	if err := d.startDaemon(setup, info); err != nil {
		return err
	}
	line, err := d.serverOut.ReadString('\n')
	srv := &smcServers{close: func() {}}
	if err == nil {
		if _, err = fmt.Sscan(line, &srv.smc, &srv.small, &srv.tcp); err != nil {
			err = fmt.Errorf("%q: %w", line, err)
		}
	}
	if err != nil {
		return fmt.Errorf("smc server process: its addresses: %w", err)
	}
	link := "the soft link between processes of one host (shared memory)"
	if d.tcpLink {
		link = "the soft RNIC's TCP link over loopback"
	}
	return measureSMC(ctx, c, out, place, srv, []smcAPI{{seriesSMC, core.Embed(d.emb)}, {seriesSMC + daemonSuffix, d.cl}}, fmt.Sprintf(
		"server node %d: a child process (embedded); client node %d in this process, and krcored node %d: a child process; %s; TCP: loopback between the same processes",
		dNodeServer, dNodeEmbedded, dNodeDaemon, link))
}

// measureSMC opens the clients' Nodes and connections to srv and runs
// every table.
func measureSMC(ctx context.Context, c *smcConfig, out *report.Output, place string, srv *smcServers, apis []smcAPI, nodes string) error {
	var sides []*smcSide
	defer func() {
		for _, s := range sides {
			s.close()
		}
	}()
	for _, a := range append(apis, smcAPI{label: seriesTCP}) {
		s, err := openSMCSide(ctx, c.timeout, a, srv)
		if s != nil {
			sides = append(sides, s)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", place, a.label, err)
		}
	}
	b := &smcBench{c: c, out: out, place: place, sides: sides, nodes: nodes}
	for _, f := range []func() error{b.rtt, b.stream, b.connect, b.connectFirst, b.many} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// openSMCSide opens a's Nodes (none for TCP: a.api nil) and connects them
// to srv: a ping-pong and a stream connection, and smcIdle+smcActive to
// the small server.
func openSMCSide(ctx context.Context, timeout time.Duration, a smcAPI, srv *smcServers) (*smcSide, error) {
	addr, small := srv.tcp, srv.tcp
	var opts, smallOpts *smc.Options
	s := &smcSide{label: a.label, timeout: timeout}
	if a.api != nil {
		addr, small = srv.smc, srv.small
		n, err := smc.Open(a.api, smc.NodeOptions{BufferSize: smcBufferSize})
		if err != nil {
			return s, err
		}
		s.nodes = append(s.nodes, n)
		opts, smallOpts = &smc.Options{Node: n}, &smc.Options{Node: n, BufferSize: smcSmallBuffer}
	}
	s.dial = func() (net.Conn, error) { return dialSMCBench(ctx, timeout, addr, opts, 's') }
	s.first = func() (time.Duration, error) {
		if a.api == nil {
			t0 := time.Now()
			conn, err := dialSMCBench(ctx, timeout, small, nil, 's')
			d := time.Since(t0)
			if err == nil {
				conn.Close()
			}
			return d, err
		}
		n, err := smc.Open(a.api, smc.NodeOptions{BufferSize: smcSmallBuffer})
		if err != nil {
			return 0, err
		}
		defer n.Close()
		t0 := time.Now()
		conn, err := dialSMCBench(ctx, timeout, small, &smc.Options{Node: n}, 's')
		d := time.Since(t0)
		if err == nil {
			err = settled(a.label, conn)
			conn.Close()
		}
		return d, err
	}
	var err error
	if s.ping, err = dialSMCBench(ctx, timeout, addr, opts, 'p'); err != nil {
		return s, err
	}
	if s.stream, err = dialSMCBench(ctx, timeout, addr, opts, 's'); err != nil {
		return s, err
	}
	for range smcIdle + smcActive {
		conn, err := dialSMCBench(ctx, timeout, small, smallOpts, 'p')
		if err != nil {
			return s, fmt.Errorf("connection %d to the small server: %w", len(s.many), err)
		}
		s.many = append(s.many, conn)
	}
	if a.api != nil {
		for _, conn := range append([]net.Conn{s.ping, s.stream}, s.many...) {
			if err := settled(a.label, conn); err != nil {
				return s, err
			}
		}
	}
	return s, nil
}

// settled fails for a connection that fell back to TCP.
func settled(label string, conn net.Conn) error {
	if m := smc.ModeOf(conn); !m.SMC {
		return fmt.Errorf("%s: the connection fell back: %v", label, m)
	}
	return nil
}

// dialSMCBench dials the bench server and names the connection's role in
// its first byte: 'p' echoes, 's' sinks. opts nil dials plain Go TCP
// (net.Dialer: smc.Dial connects differently, see smc/dial.go).
func dialSMCBench(ctx context.Context, timeout time.Duration, addr string, opts *smc.Options, role byte) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var conn net.Conn
	var err error
	if opts == nil {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", addr)
	} else {
		conn, err = smc.DialContext(ctx, "tcp", addr, opts)
	}
	if err != nil {
		return nil, err
	}
	conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte{role}); err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetWriteDeadline(time.Time{})
	return conn, nil
}

// serveSMCBench serves ln's connections until it closes: each names its
// role in its first byte.
func serveSMCBench(ln net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			var role [1]byte
			if _, err := io.ReadFull(conn, role[:]); err != nil {
				return
			}
			if role[0] == 'p' {
				io.Copy(conn, conn) // echo
				return
			}
			smcSink(conn)
		}()
	}
}

// smcSink reads streams: an 8-byte count, that many bytes, then a 1-byte
// acknowledgement of the last. Its buffer is taken at the first count:
// smc-connect's connections close without one, and 64 KiB of garbage
// each would have the server process collect every few hundred connects
// (scanning the stacks of its thousands of goroutines), which an SMC
// connect waits for, the server answering it, and a TCP connect, which
// the kernel completes, does not.
func smcSink(conn net.Conn) {
	var buf []byte
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			return
		}
		if buf == nil {
			buf = make([]byte, smcStreamSize)
		}
		for left := binary.LittleEndian.Uint64(hdr[:]); left > 0; {
			k, err := conn.Read(buf[:min(uint64(len(buf)), left)])
			if err != nil {
				return
			}
			left -= uint64(k)
		}
		if _, err := conn.Write(hdr[:1]); err != nil {
			return
		}
	}
}

// smcBench is one placement's tables.
type smcBench struct {
	c            *smcConfig
	out          *report.Output
	place, nodes string
	sides        []*smcSide
}

// latency runs one latency series per side in rotating blocks of iters
// in all, and adds their table.
func (b *smcBench) latency(test, title string, size, iters int, run func(s *smcSide, w, n int) ([]time.Duration, error), info ...perf.Field) error {
	var series []*interleave.Latency
	for _, s := range b.sides {
		series = append(series, &interleave.Latency{Run: func(w, n int) ([]time.Duration, error) { return run(s, w, n) }})
	}
	if err := interleave.WarmLatency(max(iters/10, 1), series...); err != nil {
		return fmt.Errorf("%s %s: %w", b.place, test, err)
	}
	blocks := make([]func() error, len(series))
	for i, s := range series {
		blocks[i] = s.Block(interleave.PerBlock(iters))
	}
	if err := interleave.Rotate(blocks...); err != nil {
		return fmt.Errorf("%s %s: %w", b.place, test, err)
	}
	rows := make([]perf.LatencyStats, len(series))
	for i, s := range series {
		rows[i] = perf.Latency(size, s.Samples)
		rows[i].Label = b.sides[i].label
	}
	return b.out.Add(perf.Result{Title: title, Test: test, Mode: perf.ModeLat, Column: "series", Placement: b.place, Latency: rows,
		Info: append(info, perf.Field{Key: "Nodes", Value: b.nodes}, perf.Field{Key: "Blocks", Value: fmt.Sprintf("%d per series, rotating order", interleave.Blocks)})})
}

// rtt is the smc-rtt table.
func (b *smcBench) rtt() error {
	return b.latency(testSMCRTT, "SMC vs TCP Ping-Pong Latency, 8 B (interleaved)", smcPingSize, b.c.n,
		func(s *smcSide, w, n int) ([]time.Duration, error) { return smcPingPong(s.ping, w, n, s.timeout) },
		perf.Field{Key: "Series", Value: "smc: smc.Conn, RDMA WRITE_WITH_IMM each way; smc_daemon: its client through krcored; tcp: net.Conn over loopback"})
}

// smcPingPong times n round trips of 8 bytes after w untimed ones, all
// within timeout.
func smcPingPong(conn net.Conn, w, n int, timeout time.Duration) ([]time.Duration, error) {
	defer within(conn, timeout)()
	buf := make([]byte, smcPingSize)
	samples := make([]time.Duration, 0, n)
	for i := range w + n {
		t0 := time.Now()
		if _, err := conn.Write(buf); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			return nil, err
		}
		if i >= w {
			samples = append(samples, time.Since(t0))
		}
	}
	return samples, nil
}

// stream is the smc-stream table.
func (b *smcBench) stream() error {
	var series []*interleave.Bandwidth
	for _, s := range b.sides {
		series = append(series, interleave.NewBandwidth(func(total int) ([]perf.Mark, error) {
			return smcStreamRun(s.stream, total, s.timeout)
		}))
	}
	if err := interleave.WarmBandwidth(b.c.msgs/10, series...); err != nil {
		return fmt.Errorf("%s %s: %w", b.place, testSMCStream, err)
	}
	blocks := make([]func() error, len(series))
	for i, s := range series {
		blocks[i] = s.Block(interleave.PerBlock(b.c.msgs))
	}
	if err := interleave.Rotate(blocks...); err != nil {
		return fmt.Errorf("%s %s: %w", b.place, testSMCStream, err)
	}
	rows := make([]perf.BandwidthStats, len(series))
	for i, s := range series {
		rows[i] = perf.MedianBlock(smcStreamSize, s.BlockMarks, 1)
		rows[i].Label = b.sides[i].label
	}
	return b.out.Add(perf.Result{Title: "SMC vs TCP Stream Bandwidth, 64 KiB writes (interleaved, median block)", Test: testSMCStream, Mode: perf.ModeBW,
		Column: "series", Placement: b.place, Bandwidth: rows, Info: []perf.Field{
			{Key: "Series", Value: "as smc-rtt; a block ends when the sink acknowledges its last byte"},
			{Key: "Buffers", Value: smcBuffers()},
			{Key: "Nodes", Value: b.nodes}}})
}

// within sets conn's deadline timeout from now and returns what clears it.
func within(conn net.Conn, timeout time.Duration) func() {
	conn.SetDeadline(time.Now().Add(timeout))
	return func() { conn.SetDeadline(time.Time{}) }
}

// smcStreamRun writes total messages of 64 KiB behind their count and waits for
// the sink's acknowledgement (within timeout): a mark per write, the last
// at the ack.
func smcStreamRun(conn net.Conn, total int, timeout time.Duration) ([]perf.Mark, error) {
	defer within(conn, timeout)()
	msg := make([]byte, smcStreamSize)
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(total)*smcStreamSize)
	marks := make([]perf.Mark, 1, total+1)
	t0 := time.Now()
	if _, err := conn.Write(hdr[:]); err != nil {
		return nil, err
	}
	for i := range total {
		if _, err := conn.Write(msg); err != nil {
			return nil, err
		}
		if i < total-1 {
			marks = append(marks, perf.Mark{At: time.Since(t0), Msgs: i + 1})
		}
	}
	if _, err := io.ReadFull(conn, hdr[:1]); err != nil {
		return nil, err
	}
	return append(marks, perf.Mark{At: time.Since(t0), Msgs: total}), nil
}

// connect is the smc-connect table: -n/10 connections per series.
func (b *smcBench) connect() error {
	return b.latency(testSMCConnect, "SMC vs TCP Connect, later connections (interleaved)", 0, max(b.c.n/10, interleave.Blocks),
		func(s *smcSide, w, n int) ([]time.Duration, error) {
			samples := make([]time.Duration, 0, n)
			for i := range w + n {
				t0 := time.Now()
				conn, err := s.dial()
				d := time.Since(t0)
				if err != nil {
					return nil, err
				}
				if s.label != seriesTCP {
					err = settled(s.label, conn)
				}
				conn.Close()
				if err != nil {
					return nil, err
				}
				if i >= w {
					samples = append(samples, d)
				}
			}
			return samples, nil
		},
		perf.Field{Key: "Series", Value: "smc: smc.DialContext until the connection runs SMC (TCP connect, proposal, accept, confirm); tcp: net.Dial; each closed untimed"})
}

// connectFirst is the smc-connect-first table: -n/100 connections per
// series, each from a Node of its own.
func (b *smcBench) connectFirst() error {
	return b.latency(testSMCConnectFirst, "SMC vs TCP Connect, first connection between two Nodes (interleaved)", 0, max(b.c.n/100, interleave.Blocks),
		func(s *smcSide, w, n int) ([]time.Duration, error) {
			samples := make([]time.Duration, 0, n)
			for i := range w + n {
				d, err := s.first()
				if err != nil {
					return nil, err
				}
				if i >= w {
					samples = append(samples, d)
				}
			}
			return samples, nil
		},
		perf.Field{Key: "Series", Value: fmt.Sprintf("smc: smc.DialContext from a Node opened just before, untimed (%d KiB buffers): both sides register and export a slab for the other and look it up; krcore's QPs between the nodes are pooled; tcp: net.Dial", smcSmallBuffer>>10)})
}

// many is the smc-many table: smcActive connections ping-pong at once,
// -n round trips in all per series, with smcIdle more open.
func (b *smcBench) many() error {
	return b.latency(testSMCMany, fmt.Sprintf("SMC vs TCP Ping-Pong Latency, 8 B, %d active of %d open connections (interleaved)", smcActive, smcActive+smcIdle),
		smcPingSize, max(b.c.n, smcActive*interleave.Blocks),
		func(s *smcSide, w, n int) ([]time.Duration, error) {
			per, wper := max(n/smcActive, 1), w/smcActive
			if n == 0 {
				per = 0
			}
			res := make([][]time.Duration, smcActive)
			errs := make([]error, smcActive)
			var wg sync.WaitGroup
			for i, conn := range s.many[:smcActive] {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res[i], errs[i] = smcPingPong(conn, wper, per, s.timeout)
				}()
			}
			wg.Wait()
			return slices.Concat(res...), errors.Join(errs...)
		},
		perf.Field{Key: "Series", Value: fmt.Sprintf("as smc-rtt, on %d connections at once (a goroutine each) while %d more stay open and idle; SMC buffers of %d KiB", smcActive, smcIdle, smcSmallBuffer>>10)})
}

// deriveSMCChecks makes krbench smc's ratios against TCP.
func deriveSMCChecks(rep *perf.Report) []perf.Check {
	var out []perf.Check
	for _, place := range []string{placementInproc, placementCross, placementCrossTCP} {
		rtt, stream := targetSMCRTT, targetSMCStream
		if place == placementCrossTCP {
			rtt, stream = targetSMCTCPLink, 1/targetSMCTCPLink
		}
		for _, via := range []struct{ suffix, name string }{{"", "embedded"}, {daemonSuffix, "through krcored"}} {
			name := func(what string) string { return fmt.Sprintf("%s %s: %s", place, via.name, what) }
			lat := func(test, what string, limit float64) {
				if r := rep.FindAt(place, test, perf.ModeLat); r != nil {
					if s, t := r.LabelRow(seriesSMC+via.suffix), r.LabelRow(seriesTCP); s != nil && t != nil {
						c := perf.RatioOf(name(what), s.Typical, t.Typical)
						if limit > 0 {
							c = c.AtMost(limit)
						}
						out = append(out, c)
					}
				}
			}
			lat(testSMCRTT, "SMC 8B RTT t_typical / TCP loopback 8B RTT t_typical (interleaved)", rtt)
			lat(testSMCConnect, "SMC later connect t_typical / TCP connect t_typical (interleaved)", targetSMCConnect)
			lat(testSMCConnectFirst, "SMC first connect t_typical / TCP connect t_typical (interleaved)", 0)
			lat(testSMCMany, fmt.Sprintf("SMC 8B RTT t_typical / TCP 8B RTT t_typical, %d active of %d open (interleaved)", smcActive, smcActive+smcIdle), 0)
			if r := rep.FindAt(place, testSMCStream, perf.ModeBW); r != nil {
				if s, t := r.BandwidthLabelRow(seriesSMC+via.suffix), r.BandwidthLabelRow(seriesTCP); s != nil && t != nil {
					out = append(out, perf.RatioOf(name("SMC 64KiB stream BW / TCP loopback stream BW (median blocks, interleaved)"),
						s.AvgMBps, t.AvgMBps).AtLeast(stream))
				}
			}
		}
	}
	return out
}

// runSMCRole runs krbench smc or its server process when args name one;
// ok is false otherwise.
func runSMCRole(ctx context.Context, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "smc":
		return runSMCCmd(ctx, args[1:], stdout, stderr), true
	case childSMCServer:
		return childStatus(stderr, args[0], runSMCServer(ctx, stdout)), true
	}
	return 0, false
}

// smcBuffers describes the buffers of smc-rtt and smc-stream.
func smcBuffers() string {
	if smcBufferSize == 0 {
		return fmt.Sprintf("SMC receive and staging buffers adapting: %d KiB, a stream's growing up to %d KiB", smc.DefaultBufferSize>>10, smc.DefaultMaxBufferSize>>10)
	}
	return fmt.Sprintf("SMC receive and staging buffers of %d KiB", smcBufferSize>>10)
}
