// Package pingpong is `krbench pingpong`: rdma-core's ibv_rc_pingpong on
// krcore's verbs API over the ibverbs provider: the same flags, the same out-of-band exchange
// (ppwire.go), the same RC SEND/RECV traffic and the same result lines, so
// either side can be the C tool:
//
//	krbench pingpong -d rxe0 -g 1                  # server
//	ibv_rc_pingpong -d rxe0 -g 1 10.0.0.1          # client (or the other way round)
//
// Both sides post -r receives before the exchange; the server connects its
// QP (RTR, RTS) before it answers, the client after; the client sends
// first. Each side then sends its next message once its previous send has
// completed and the peer's message has arrived, until -n sends and -n
// receives have completed; receives are reposted in bulk when one is left.
// Times run from the client's first send (the server's first poll) to the
// last completion.
//
// Differences from the C tool: every wait is bounded by -timeout (the C
// tool waits forever); the client retries a refused TCP connection until
// -timeout, so it may start before the server; -c reports a corrupted
// buffer with the same line and then exits 1 (the C tool exits 0); -l
// accepts only 0 (the verbs API sets no service level); -o, -t, -j and -N
// are not offered.
package pingpong

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/krcore/krcore/internal/bench/flags"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/verbs"
)

// ppDefaults are ibv_rc_pingpong's defaults.
const (
	ppDefaultPort    = 18515
	ppDefaultSize    = 4096
	ppDefaultMTU     = 1024
	ppDefaultRxDepth = 500
	ppDefaultIters   = 1000
)

// Bounds on -s and -r: the largest message and receive queue krbench's
// other tests take.
const (
	ppMaxSize    = 8 << 20
	ppMaxRxDepth = 8192
)

// Work request IDs, as the C tool numbers them: bit flags of what a side
// still waits for before its next send.
const (
	ppRecvID = 1
	ppSendID = 2
)

// ppConfig is a parsed `krbench pingpong` command line.
type ppConfig struct {
	server  string // the server's host; "" runs the server side
	port    int
	dev     string
	ibPort  int
	size    int
	mtu     int
	rxDepth int
	iters   int
	sl      int
	events  bool
	gidIdx  int
	chk     bool
	timeout time.Duration
}

const ppUsage = `usage:
  krbench pingpong [flags]             start a server and wait for a connection
  krbench pingpong [flags] <host>      connect to the server at <host>

ibv_rc_pingpong on krcore's verbs (provider ibverbs); interoperates with rdma-core's tool.
Every flag has a short and a long name (-p or -port, -d or -ib-dev ...).

flags:
`

// parsePingpong reads the command line after "pingpong". Flags and the
// server name may come in any order, as with getopt.
func parsePingpong(args []string, stderr io.Writer) (*ppConfig, error) {
	cfg := &ppConfig{}
	fs := flags.NewSet("krbench pingpong", ppUsage, stderr)
	both := func(short, long string, def int, p *int, usage string) {
		fs.IntVar(p, short, def, usage)
		fs.IntVar(p, long, def, "same as -"+short)
	}
	both("p", "port", ppDefaultPort, &cfg.port, "listen on/connect to TCP `port`")
	fs.StringVar(&cfg.dev, "d", "", "use IB `device` (default first device found)")
	fs.StringVar(&cfg.dev, "ib-dev", "", "same as -d")
	both("i", "ib-port", 1, &cfg.ibPort, "use `port` of the IB device")
	both("s", "size", ppDefaultSize, &cfg.size, "`size` of message to exchange")
	both("m", "mtu", ppDefaultMTU, &cfg.mtu, "path `MTU` (256, 512, 1024, 2048 or 4096)")
	both("r", "rx-depth", ppDefaultRxDepth, &cfg.rxDepth, "number of receives to post at a time")
	both("n", "iters", ppDefaultIters, &cfg.iters, "number of exchanges")
	both("l", "sl", 0, &cfg.sl, "service level (only 0: the verbs API sets none)")
	fs.BoolVar(&cfg.events, "e", false, "sleep on CQ events (default poll)")
	fs.BoolVar(&cfg.events, "events", false, "same as -e")
	both("g", "gid-idx", -1, &cfg.gidIdx, "local port GID `index` (RoCE needs one; without it the GID sent is zero)")
	fs.BoolVar(&cfg.chk, "c", false, "validate the received buffer (server side)")
	fs.BoolVar(&cfg.chk, "chk", false, "same as -c")
	fs.DurationVar(&cfg.timeout, "timeout", time.Minute, "bound on every wait: accept, connect, exchange, each completion")

	// A lone "-" is a word, as getopt has it.
	words, err := flags.ParseMixed(fs, args, func(a string) bool { return !strings.HasPrefix(a, "-") || a == "-" })
	if err != nil {
		return nil, err
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", flags.ErrUsage, fmt.Sprintf(format, a...))
	}
	switch {
	case len(words) > 1:
		return nil, bad("one server name at most, got %q", words)
	case cfg.port < 0 || cfg.port > 65535:
		return nil, bad("-p %d out of range", cfg.port)
	case cfg.ibPort < 1:
		return nil, bad("-i %d: ports count from 1", cfg.ibPort)
	case cfg.size < 1 || cfg.size > ppMaxSize:
		return nil, bad("-s %d: want 1..%d", cfg.size, ppMaxSize)
	case cfg.rxDepth < 2 || cfg.rxDepth > ppMaxRxDepth:
		return nil, bad("-r %d: want 2..%d", cfg.rxDepth, ppMaxRxDepth)
	case cfg.iters < 1:
		return nil, bad("-n %d: want at least 1", cfg.iters)
	case cfg.sl != 0:
		return nil, bad("-l %d: the verbs API sets no service level; only 0 is supported", cfg.sl)
	case cfg.timeout <= 0:
		return nil, bad("-timeout %v: want a positive duration", cfg.timeout)
	}
	switch cfg.mtu {
	case 256, 512, 1024, 2048, 4096:
	default:
		return nil, bad("-m %d: want 256, 512, 1024, 2048 or 4096", cfg.mtu)
	}
	if len(words) == 1 {
		cfg.server = words[0]
	}
	if !ibverbs.Built {
		return nil, fmt.Errorf("%w: pingpong needs the ibverbs provider: %w", flags.ErrUsage, ibverbs.ErrNotBuilt)
	}
	return cfg, nil
}

// Run is `krbench pingpong`; it returns the exit status: 0, 1 on
// a failed run, 2 on bad usage (and in a build without the rdma tag).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parsePingpong(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "krbench pingpong: %v\n", err)
		return 2
	}
	if err := pingpong(ctx, cfg, stdout); err != nil {
		fmt.Fprintf(stderr, "krbench pingpong: %v\n", err)
		return 1
	}
	return 0
}

// ppCtx is one side's verbs objects, what the C tool calls its context.
type ppCtx struct {
	dev    verbs.Device
	buf    *offheap.Block
	pd     verbs.PD
	mr     verbs.MR
	cq     verbs.CQ
	qp     verbs.QP
	inline bool

	send  []verbs.SendWR
	recvs []verbs.RecvWR
	wc    []verbs.WC
}

func (c *ppCtx) close() error {
	var errs []error
	if c.qp != nil {
		errs = append(errs, c.qp.Close())
	}
	if c.mr != nil {
		errs = append(errs, c.mr.Close())
	}
	if c.cq != nil {
		errs = append(errs, c.cq.Close())
	}
	if c.pd != nil {
		errs = append(errs, c.pd.Close())
	}
	if c.dev != nil {
		errs = append(errs, c.dev.Close())
	}
	if c.buf != nil {
		errs = append(errs, c.buf.Close())
	}
	return errors.Join(errs...)
}

// newPPCtx opens the device and makes PD, MR, CQ and an RC QP in INIT,
// shaped as the C tool's: one send, rx-depth receives, a CQ of rx-depth+1.
func newPPCtx(ctx context.Context, cfg *ppConfig) (_ *ppCtx, err error) {
	c := &ppCtx{}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	if c.dev, err = ibverbs.Open(ctx, cfg.dev, cfg.ibPort, cfg.gidIdx); err != nil {
		return nil, err
	}
	if c.buf, err = rawqp.AllocBuf(cfg.size); err != nil {
		return nil, err
	}
	b := c.buf.Bytes()[:cfg.size]
	for i := range b {
		b[i] = 0x7b // what the C tool fills its buffer with
	}
	attr := c.dev.Attr()
	if cfg.rxDepth > attr.MaxQPWR {
		return nil, fmt.Errorf("-r %d exceeds the device's %d work requests per queue", cfg.rxDepth, attr.MaxQPWR)
	}
	if c.pd, err = c.dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("couldn't allocate PD: %w", err)
	}
	if c.mr, err = c.pd.RegMR(c.buf.Bytes(), verbs.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("couldn't register MR: %w", err)
	}
	if c.cq, err = c.dev.CreateCQ(cfg.rxDepth + 1); err != nil {
		return nil, fmt.Errorf("couldn't create CQ: %w", err)
	}
	c.inline = cfg.size <= attr.MaxInline
	inline := 0
	if c.inline {
		inline = cfg.size
	}
	c.qp, err = c.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: c.cq, RecvCQ: c.cq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: cfg.rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: inline}})
	if err != nil {
		return nil, fmt.Errorf("couldn't create QP: %w", err)
	}
	if err := c.qp.Modify(verbs.QPAttr{State: verbs.StateInit}); err != nil {
		return nil, fmt.Errorf("failed to modify QP to INIT: %w", err)
	}
	sge := []verbs.SGE{verbs.SGEOf(c.mr, 0, cfg.size)}
	c.send = []verbs.SendWR{{ID: ppSendID, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: sge}}
	if c.inline {
		c.send[0].Flags |= verbs.Inline
	}
	c.recvs = make([]verbs.RecvWR, cfg.rxDepth)
	for i := range c.recvs {
		c.recvs[i] = verbs.RecvWR{ID: ppRecvID, SGL: sge}
	}
	c.wc = make([]verbs.WC, 2) // the C tool polls two at a time
	return c, nil
}

// postRecvs posts n receives and returns how many were accepted.
func (c *ppCtx) postRecvs(n int) (int, error) {
	return c.qp.PostRecv(c.recvs[:n])
}

// connect moves the QP to RTR and RTS towards rem with the C tool's path
// attributes: MTU -m, RNR timer code 12 (0.64 ms), ACK timeout code 14
// (4.096 us * 2^14, 67 ms), seven retries and RNR retries.
func (c *ppCtx) connect(cfg *ppConfig, my, rem ppDest) error {
	dest := verbs.Endpoint{GID: rem.GID, LID: rem.LID, QPN: rem.QPN, PSN: rem.PSN}
	if err := c.qp.Modify(verbs.QPAttr{State: verbs.StateRTR, Dest: dest, MTU: cfg.mtu, MinRNRTimer: 640 * time.Microsecond}); err != nil {
		return fmt.Errorf("failed to modify QP to RTR: %w", err)
	}
	if err := c.qp.Modify(verbs.QPAttr{State: verbs.StateRTS, SQPSN: my.PSN, Timeout: time.Duration(4096) << 14, RetryCount: 7, RNRRetry: 7}); err != nil {
		return fmt.Errorf("failed to modify QP to RTS: %w", err)
	}
	return nil
}

// poll returns at least one completion: it busy-polls, or with -e sleeps
// on the CQ's completion channel, and gives up after timeout without one.
func (c *ppCtx) poll(ctx context.Context, events bool, timeout time.Duration) ([]verbs.WC, error) {
	deadline := time.Now().Add(timeout)
	for i := 1; ; i++ {
		n, err := c.cq.Poll(c.wc)
		if err != nil {
			return nil, fmt.Errorf("poll CQ failed: %w", err)
		}
		if n > 0 {
			return c.wc[:n], nil
		}
		if events {
			wctx, cancel := context.WithDeadline(ctx, deadline)
			err = c.cq.Wait(wctx)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("failed to get CQ event: %w", err)
			}
		} else if i%1024 != 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !time.Now().Before(deadline) {
			return nil, fmt.Errorf("no completion for %v (is the peer alive?)", timeout)
		}
	}
}

// pingpong runs one side of the test and prints what the C tool prints.
func pingpong(ctx context.Context, cfg *ppConfig, stdout io.Writer) (err error) {
	c, err := newPPCtx(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := c.close(); cerr != nil && err == nil {
			err = fmt.Errorf("release verbs objects: %w", cerr)
		}
	}()
	routs, err := c.postRecvs(cfg.rxDepth)
	if err != nil {
		return fmt.Errorf("couldn't post receive (%d): %w", routs, err)
	}
	port := c.dev.Port()
	my := ppDest{LID: port.LID, QPN: c.qp.Num(), PSN: c.qp.Endpoint().PSN}
	if cfg.gidIdx >= 0 {
		my.GID = port.GID
	}
	// The server listens before it prints its address, so a script may
	// start the client once the line is out.
	var ln net.Listener
	if cfg.server == "" {
		if ln, err = net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(cfg.port))); err != nil {
			return fmt.Errorf("couldn't listen to port %d: %w", cfg.port, err)
		}
		defer ln.Close()
	}
	fmt.Fprintf(stdout, "  local address:  %s\n", my)

	var rem ppDest
	if cfg.server == "" {
		rem, err = ppServerExchange(ctx, ln, cfg, my, func(rem ppDest) error { return c.connect(cfg, my, rem) })
	} else {
		rem, err = ppClientExchange(ctx, cfg, my)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "  remote address: %s\n", rem)
	if cfg.server != "" {
		if err := c.connect(cfg, my, rem); err != nil {
			return err
		}
	}

	page := os.Getpagesize()
	buf := c.buf.Bytes()[:cfg.size]
	pending := ppRecvID
	if cfg.server != "" {
		if cfg.chk {
			for i := 0; i < len(buf); i += page {
				buf[i] = 0 // the C tool's pattern: the first byte of every page
			}
		}
		if _, err := c.qp.PostSend(c.send); err != nil {
			return fmt.Errorf("couldn't post send: %w", err)
		}
		pending |= ppSendID
	}
	start := time.Now()
	rcnt, scnt := 0, 0
	for rcnt < cfg.iters || scnt < cfg.iters {
		wcs, err := c.poll(ctx, cfg.events, cfg.timeout)
		if err != nil {
			return fmt.Errorf("after %d sends and %d receives of %d: %w", scnt, rcnt, cfg.iters, err)
		}
		for i := range wcs {
			wc := &wcs[i]
			if wc.Status != verbs.Success {
				return fmt.Errorf("failed status %s (%d) for wr_id %d", wc.Status, uint8(wc.Status), wc.ID)
			}
			switch wc.ID {
			case ppSendID:
				scnt++
			case ppRecvID:
				if routs--; routs <= 1 {
					n, err := c.postRecvs(cfg.rxDepth - routs)
					routs += n
					if err != nil {
						return fmt.Errorf("couldn't post receive (%d): %w", routs, err)
					}
				}
				rcnt++
			default:
				return fmt.Errorf("completion for unknown wr_id %d", wc.ID)
			}
			pending &^= int(wc.ID)
			if scnt < cfg.iters && pending == 0 {
				if _, err := c.qp.PostSend(c.send); err != nil {
					return fmt.Errorf("couldn't post send: %w", err)
				}
				pending = ppRecvID | ppSendID
			}
		}
	}
	usec := float64(time.Since(start).Nanoseconds()) / 1e3
	bytes := int64(cfg.size) * int64(cfg.iters) * 2
	fmt.Fprintf(stdout, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, usec/1e6, float64(bytes)*8/usec)
	fmt.Fprintf(stdout, "%d iters in %.2f seconds = %.2f usec/iter\n", cfg.iters, usec/1e6, usec/float64(cfg.iters))
	if cfg.server == "" && cfg.chk {
		for i := 0; i < len(buf); i += page {
			if buf[i] != 0 {
				fmt.Fprintf(stdout, "invalid data in page %d\n", i/page)
				return fmt.Errorf("-c: received data differs from the pattern in page %d", i/page)
			}
		}
	}
	return nil
}

// ppServerExchange accepts one client on ln, reads its address, connects
// the QP with connect (before answering: the client may send as soon as it
// has the answer), answers with my address and waits for "done".
func ppServerExchange(ctx context.Context, ln net.Listener, cfg *ppConfig, my ppDest, connect func(ppDest) error) (ppDest, error) {
	deadline := time.Now().Add(cfg.timeout)
	if tl, ok := ln.(*net.TCPListener); ok {
		tl.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conn, err := ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return ppDest{}, ctx.Err()
		}
		return ppDest{}, fmt.Errorf("accept() failed (no client within -timeout %v?): %w", cfg.timeout, err)
	}
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	conn.SetDeadline(deadline)
	msg := make([]byte, ppMsgLen)
	if _, err := io.ReadFull(conn, msg); err != nil {
		return ppDest{}, fmt.Errorf("couldn't read remote address from %s: %w", conn.RemoteAddr(), err)
	}
	rem, err := decodePPMsg(msg)
	if err != nil {
		return ppDest{}, fmt.Errorf("from %s: %w", conn.RemoteAddr(), err)
	}
	if err := connect(rem); err != nil {
		return ppDest{}, fmt.Errorf("couldn't connect to remote QP: %w", err)
	}
	out, err := encodePPMsg(my)
	if err != nil {
		return ppDest{}, err
	}
	if _, err := conn.Write(out); err != nil {
		return ppDest{}, fmt.Errorf("couldn't send local address: %w", err)
	}
	done := make([]byte, len(ppDone))
	if _, err := io.ReadFull(conn, done); err != nil {
		return ppDest{}, fmt.Errorf("couldn't read \"done\" from %s: %w", conn.RemoteAddr(), err)
	}
	if string(done) != string(ppDone) {
		return ppDest{}, fmt.Errorf("%w: got %q where \"done\" and its NUL belong", errPPMsg, done)
	}
	return rem, nil
}

// ppClientExchange connects to the server (retrying while it refuses,
// until -timeout), sends my address, reads the server's and says "done".
func ppClientExchange(ctx context.Context, cfg *ppConfig, my ppDest) (ppDest, error) {
	addr := net.JoinHostPort(strings.TrimSuffix(strings.TrimPrefix(cfg.server, "["), "]"), strconv.Itoa(cfg.port))
	deadline := time.Now().Add(cfg.timeout)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var conn net.Conn
	for {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(dctx, "tcp", addr)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || dctx.Err() != nil {
			return ppDest{}, fmt.Errorf("couldn't connect to %s: %w", addr, err)
		}
		select {
		case <-dctx.Done():
			return ppDest{}, fmt.Errorf("couldn't connect to %s: refused until -timeout %v", addr, cfg.timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	conn.SetDeadline(deadline)
	out, err := encodePPMsg(my)
	if err != nil {
		return ppDest{}, err
	}
	if _, err := conn.Write(out); err != nil {
		return ppDest{}, fmt.Errorf("couldn't send local address to %s: %w", addr, err)
	}
	msg := make([]byte, ppMsgLen)
	if _, err := io.ReadFull(conn, msg); err != nil {
		return ppDest{}, fmt.Errorf("couldn't read remote address from %s: %w", addr, err)
	}
	rem, err := decodePPMsg(msg)
	if err != nil {
		return ppDest{}, fmt.Errorf("from %s: %w", addr, err)
	}
	if _, err := conn.Write(ppDone); err != nil {
		return ppDest{}, fmt.Errorf("couldn't write \"done\" to %s: %w", addr, err)
	}
	return rem, nil
}
