package smc

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/smc/internal/kernellink"
	"github.com/krcore/krcore/smc/internal/smcopt"
	"github.com/krcore/krcore/smc/internal/smcr"
	"github.com/krcore/krcore/verbs"
)

// RDMAConfig names the RDMA device of the kernel wire mode (OpenRDMA):
// SMC-Rv2 as Linux's AF_SMC speaks it, on an ibverbs device (rxe or a
// RoCE NIC).
type RDMAConfig struct {
	// Device, Port and GIDIndex select the ibverbs device, as the
	// commands' -ib-dev/-ib-port/-gid-idx do ("" the first device, 0 port
	// 1, a negative index the GID the provider picks). The device's port
	// must carry the address the TCP connections use.
	Device   string
	Port     int
	GIDIndex int
	// Interface is the network device under Device (its MAC goes into
	// the CLC messages).
	Interface string
	// EID is the user EID (UEID) shared with the kernel peers: Linux
	// offers SMC-Rv2 only with one (smc_ueid add).
	EID string
	// Hostname goes into the first-contact extension; "" is krcore.
	Hostname string
	// Linger is how long a link group without connections stays up for
	// the next one to the same kernel peer; 0 is one second, and a
	// negative Linger ends an idle group at once (DELETE_LINK as its last
	// connection is freed).
	Linger time.Duration
}

// RDMA is the kernel wire mode's device: its link groups toward kernel
// AF_SMC peers and the SMC TCP option on its sockets. Set it as
// Options.RDMA; Close ends the groups (DELETE_LINK) and the option.
type RDMA struct {
	dev verbs.Device
	ep  *kernellink.Endpoint

	mu     sync.Mutex
	opt    *smcopt.Announcer // loaded by the first Listen or Dial
	optErr error             // why it could not be: Listen and Dial run TCP
	closed bool
}

// openAnnouncer loads the SMC option's BPF program (a variable for tests
// of a process without the privileges).
var openAnnouncer = smcopt.Open

// OpenRDMA opens the device cfg names. It needs a build with -tags rdma
// (libibverbs; otherwise the error wraps ibverbs.ErrNotBuilt), and
// Listen and Dial with it need root once (CAP_BPF, CAP_NET_ADMIN) to
// announce SMC in the SYN and SYN-ACK with a cgroup BPF program, as the
// kernel peer requires.
func OpenRDMA(ctx context.Context, cfg RDMAConfig) (*RDMA, error) {
	if cfg.EID == "" || cfg.Interface == "" {
		return nil, fmt.Errorf("smc: OpenRDMA needs an EID and the Interface under the device: %w", krcore.ErrInvalid)
	}
	ifc, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("smc: OpenRDMA: %w", err)
	}
	dev, err := ibverbs.Open(ctx, cfg.Device, cfg.Port, cfg.GIDIndex)
	if err != nil {
		return nil, fmt.Errorf("smc: opening RDMA device %q: %w", cfg.Device, err)
	}
	kc := kernellink.Config{Device: dev, MAC: ifc.HardwareAddr, Hostname: cfg.Hostname,
		EID: smcr.MakeEID(cfg.EID), Linger: cfg.Linger}
	if kc.Hostname == "" {
		kc.Hostname = "krcore"
	}
	if kc.Linger == 0 {
		kc.Linger = time.Second
	}
	rand.Read(kc.SystemID[:])
	return &RDMA{dev: dev, ep: kernellink.NewEndpoint(kc)}, nil
}

// LinkGroups is how many link groups toward kernel peers are up.
func (r *RDMA) LinkGroups() int { return r.ep.Groups() }

// AddLinksDeclined is how many ADD_LINK requests (a kernel server
// offering a second link) were declined: link groups here keep one link.
func (r *RDMA) AddLinksDeclined() int64 { return r.ep.AddLinksDeclined() }

// Close ends the link groups, aborting their connections, withdraws the
// SMC option and closes the device.
func (r *RDMA) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	opt := r.opt
	r.mu.Unlock()
	errs := []error{r.ep.Close()}
	if opt != nil {
		errs = append(errs, opt.Close())
	}
	errs = append(errs, r.dev.Close())
	return errors.Join(errs...)
}

// option is the SMC option's announcer, loaded on first use: a cgroup
// BPF program that puts the option into the SYNs and SYN-ACKs of the
// sockets it marks. A process that cannot load it (no CAP_BPF or
// CAP_NET_ADMIN: the error matches syscall.EPERM) has no SMC-Rv2 toward
// the kernel, and its Listen and Dial run plain TCP (fallback, below):
// the load is tried once, not on every call.
func (r *RDMA) option() (opt *smcopt.Announcer, fallback error, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, nil, fmt.Errorf("smc: RDMA device: %w", krcore.ErrClosed)
	}
	if r.opt == nil && r.optErr == nil {
		a, err := openAnnouncer("")
		if err != nil {
			r.optErr = fmt.Errorf("smc: announcing SMC in the TCP handshake: %w", err)
		}
		r.opt = a
	}
	return r.opt, r.optErr, nil
}

// noAnnouncer is the mode of a kernel wire mode connection whose process
// cannot announce SMC (RDMA.option): TCP, as Linux's AF_SMC falls back
// when it has no usable SMC device (SMC_CLC_DECL_NOSMCDEV).
func noAnnouncer(err error) Mode { return Mode{Reason: ReasonNoRuntime, Err: err} }

// rdmaListener is a Listener in the kernel wire mode: each accepted
// connection's handshake runs on its own goroutine, and Accept returns
// them as they finish.
type rdmaListener struct {
	r     *RDMA
	opts  Options
	ready chan net.Conn
	stop  context.CancelFunc
	ctx   context.Context
	wg    sync.WaitGroup
}

func listenRDMA(network, addr string, opts *Options) (*Listener, error) {
	opt, fallback, err := opts.RDMA.option()
	if err != nil {
		return nil, err
	}
	if fallback != nil {
		ln, err := net.Listen(network, addr)
		if err != nil {
			return nil, err
		}
		tl, ok := ln.(*net.TCPListener)
		if !ok {
			ln.Close()
			return nil, fmt.Errorf("smc: listen on %s: not TCP: %w", network, krcore.ErrInvalid)
		}
		return &Listener{tcp: tl, opts: *opts, noSMC: fallback}, nil
	}
	ctx, stop := context.WithCancel(context.Background())
	tl, err := smcopt.Listen(ctx, addr, opt)
	if err != nil {
		stop()
		return nil, fmt.Errorf("smc: listen: %w", err)
	}
	rl := &rdmaListener{r: opts.RDMA, opts: *opts, ready: make(chan net.Conn), stop: stop, ctx: ctx}
	rl.wg.Add(1)
	go rl.serve(tl) // owned by the Listener: Close stops it
	return &Listener{tcp: tl, opts: *opts, rdma: rl}, nil
}

// serve accepts TCP connections until the listener closes.
func (rl *rdmaListener) serve(tl *net.TCPListener) {
	defer rl.wg.Done()
	for {
		tc, err := tl.AcceptTCP()
		if err != nil {
			return
		}
		rl.wg.Add(1)
		go func() { // owned by the Listener: its ctx bounds the handshake
			defer rl.wg.Done()
			c := rl.handshake(tc)
			if c == nil {
				return
			}
			select {
			case rl.ready <- c:
			case <-rl.ctx.Done():
				c.Close()
			}
		}()
	}
}

// handshake settles one accepted connection: a client whose SYN carried
// no SMC option is plain TCP at once; a kernel client's proposal is
// answered (accepted, or declined: TCP); first bytes that are no CLC
// message are a plain client's (TCP, the bytes kept). A connection whose
// handshake failed past the point of a clean fallback is closed (nil).
func (rl *rdmaListener) handshake(tc *net.TCPConn) net.Conn {
	smc, err := smcopt.PeerAnnounced(tc)
	if err != nil || !smc {
		return &tcpConn{tcp: tc, r: tc, mode: Mode{Reason: ReasonPeerNoSMC, Err: err}}
	}
	ctx, cancel := context.WithTimeout(rl.ctx, rl.opts.handshakeTimeout())
	defer cancel()
	// Close does not wait out a silent client's handshake timeout.
	defer context.AfterFunc(rl.ctx, func() { tc.SetReadDeadline(time.Now()) })()
	br := bufio.NewReader(tc)
	tc.SetReadDeadline(time.Now().Add(rl.opts.handshakeTimeout()))
	eye, err := br.Peek(len(smcr.EyecatcherR))
	if err != nil || [4]byte(eye) != smcr.EyecatcherR {
		tc.SetReadDeadline(time.Time{})
		return &tcpConn{tcp: tc, r: br, mode: Mode{Reason: ReasonPeerNoSMC, Err: err}}
	}
	b, err := smcr.ReadCLC(br)
	tc.SetReadDeadline(time.Time{})
	var p *smcr.Proposal
	if err == nil {
		p, err = smcr.DecodeProposal(b)
	}
	if err != nil || br.Buffered() > 0 { // a client speaks only after the accept
		tc.Close()
		return nil
	}
	kc, err := rl.r.ep.Accept(ctx, tc, p)
	return settle(tc, kc, err)
}

// settle is the connection a handshake ended with: over SMC-R, TCP after
// a decline either way, or nil (tc closed) after any other failure.
func settle(tc *net.TCPConn, kc *kernellink.Conn, err error) net.Conn {
	var d *kernellink.Declined
	switch {
	case err == nil:
		return newRDMAConn(tc, kc)
	case errors.As(err, &d) && d.Ours:
		return &tcpConn{tcp: tc, r: tc, mode: Mode{Reason: Reason(d.Code), Err: err}}
	case errors.As(err, &d):
		return &tcpConn{tcp: tc, r: tc, mode: Mode{Reason: ReasonPeerDeclined, Peer: Reason(d.Code)}}
	}
	tc.Close()
	return nil
}

func (rl *rdmaListener) accept() (net.Conn, error) {
	select {
	case c := <-rl.ready:
		return c, nil
	case <-rl.ctx.Done():
		return nil, net.ErrClosed
	}
}

func (rl *rdmaListener) close() {
	rl.stop()
	rl.wg.Wait()
}

// dialRDMA connects with the SMC option in the SYN; a server whose
// SYN-ACK carries it too (a kernel AF_SMC server, or any SMC-Rv2 one) is
// sent our SMC-Rv2 proposal at once, any other is talked to over TCP
// (ReasonPeerNoSMC), as the kernel's own client does.
func dialRDMA(ctx context.Context, network, addr string, opts *Options) (net.Conn, error) {
	opt, fallback, err := opts.RDMA.option()
	if err != nil {
		return nil, err
	}
	if fallback != nil {
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := nc.(*net.TCPConn)
		return &tcpConn{tcp: tc, r: tc, mode: noAnnouncer(fallback)}, nil
	}
	d := net.Dialer{Control: opt.Control}
	d.SetMultipathTCP(false) // only plain TCP carries the option
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := nc.(*net.TCPConn)
	if smc, err := opt.ServerAnnounced(tc); err != nil || !smc {
		return &tcpConn{tcp: tc, r: tc, mode: Mode{Reason: ReasonPeerNoSMC, Err: err}}, nil
	}
	hctx, cancel := context.WithTimeout(ctx, opts.handshakeTimeout())
	defer cancel()
	kc, err := opts.RDMA.ep.Dial(hctx, tc)
	if c := settle(tc, kc, err); c != nil {
		return c, nil
	}
	return nil, &net.OpError{Op: "dial", Net: "smc", Addr: tc.RemoteAddr(), Err: err}
}

// rdmaConn is a connection in the kernel wire mode: its bytes go over
// SMC-R, its TCP connection stays beside it for the addresses. (It holds
// the TCP connection in a field, not embedded: io.Copy would take the
// embedded one's ReadFrom and WriteTo, past the SMC-R data path.)
type rdmaConn struct {
	tcp    *net.TCPConn
	kc     *kernellink.Conn
	rd, wd deadline
}

func newRDMAConn(tc *net.TCPConn, kc *kernellink.Conn) *rdmaConn {
	return &rdmaConn{tcp: tc, kc: kc, rd: makeDeadline(), wd: makeDeadline()}
}

func (c *rdmaConn) Read(p []byte) (int, error) {
	n, err := c.kc.Read(p, c.rd.wait())
	return n, c.opErr("read", err)
}

func (c *rdmaConn) Write(p []byte) (int, error) {
	n, err := c.kc.Write(p, c.wd.wait())
	return n, c.opErr("write", err)
}

func (c *rdmaConn) opErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "smc", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// CloseWrite sends the done-writing flag after every byte written.
func (c *rdmaConn) CloseWrite() error { return c.opErr("close", c.kc.CloseWrite()) }

// Close closes the SMC-R connection (the closed flag to the peer), then
// its TCP connection.
func (c *rdmaConn) Close() error {
	err := c.kc.Close()
	return errors.Join(c.opErr("close", err), c.tcp.Close())
}

func (c *rdmaConn) LocalAddr() net.Addr  { return c.tcp.LocalAddr() }
func (c *rdmaConn) RemoteAddr() net.Addr { return c.tcp.RemoteAddr() }

func (c *rdmaConn) SetDeadline(t time.Time) error {
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

func (c *rdmaConn) SetReadDeadline(t time.Time) error  { c.rd.set(t); return nil }
func (c *rdmaConn) SetWriteDeadline(t time.Time) error { c.wd.set(t); return nil }

// tcpConn is a connection of the kernel wire mode that runs over TCP; r
// holds the first bytes already read.
type tcpConn struct {
	tcp  *net.TCPConn
	r    io.Reader
	mode Mode
}

func (c *tcpConn) Read(p []byte) (int, error)         { return c.r.Read(p) }
func (c *tcpConn) Write(p []byte) (int, error)        { return c.tcp.Write(p) }
func (c *tcpConn) Close() error                       { return c.tcp.Close() }
func (c *tcpConn) CloseWrite() error                  { return c.tcp.CloseWrite() }
func (c *tcpConn) LocalAddr() net.Addr                { return c.tcp.LocalAddr() }
func (c *tcpConn) RemoteAddr() net.Addr               { return c.tcp.RemoteAddr() }
func (c *tcpConn) SetDeadline(t time.Time) error      { return c.tcp.SetDeadline(t) }
func (c *tcpConn) SetReadDeadline(t time.Time) error  { return c.tcp.SetReadDeadline(t) }
func (c *tcpConn) SetWriteDeadline(t time.Time) error { return c.tcp.SetWriteDeadline(t) }
