package smc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/krcore/krcore"
)

// Defaults of Options.
const (
	// DefaultHandshakeTimeout bounds the CLC exchange when
	// Options.HandshakeTimeout is 0.
	DefaultHandshakeTimeout = 5 * time.Second
	// DefaultDetectWait is how long a server's first write waits for a
	// client's proposal when Options.DetectWait is 0.
	DefaultDetectWait = 10 * time.Millisecond
)

// Options configure Listen and Dial.
type Options struct {
	// Node is the process's SMC endpoint (Open). Nil runs plain TCP: a
	// dialer sends no proposal, a listener declines every one.
	Node *Node
	// HandshakeTimeout bounds the CLC exchange; past it the connection
	// falls back to TCP (ReasonTimeout). 0 is DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// RDMA, when set, is the kernel wire mode: SMC-Rv2 toward Linux
	// kernel AF_SMC peers on an RDMA device (OpenRDMA), with the SMC
	// option in the TCP handshake; Node is then unused.
	RDMA *RDMA
	// DetectWait is how long an accepted connection's first Write waits
	// for the client's first bytes when none came yet (see the package
	// doc); 0 is DefaultDetectWait, negative is no wait.
	DetectWait time.Duration
	// BufferSize fixes the receive buffer of the connections dialled or
	// accepted with these options, in bytes, from MinBufferSize to 1 GiB
	// (their send staging rings start at it and follow the peer's
	// receive buffer, which an adapting peer may grow); 0 leaves it to
	// the Node (NodeOptions.BufferSize, or adapting). Many idle
	// connections of a Node can so take small buffers while others of
	// the same Node adapt, without a second Node (whose port another
	// goroutine of the process would wait on).
	BufferSize int
}

// check reports options that cannot work.
func (o *Options) check() error {
	if err := checkSize(o.BufferSize); err != nil {
		return fmt.Errorf("smc: %w", err)
	}
	return nil
}

// checkSize refuses a fixed buffer size (Options.BufferSize,
// NodeOptions.BufferSize) out of its range; 0 adapts.
func checkSize(size int) error {
	if size != 0 && (size < MinBufferSize || size > maxBuffer) {
		return fmt.Errorf("buffer size %d, want 0 or %d-%d: %w", size, MinBufferSize, maxBuffer, krcore.ErrInvalid)
	}
	return nil
}

func (o *Options) handshakeTimeout() time.Duration {
	if o.HandshakeTimeout > 0 {
		return o.HandshakeTimeout
	}
	return DefaultHandshakeTimeout
}

func (o *Options) detectWait() time.Duration {
	switch {
	case o.DetectWait < 0:
		return 0
	case o.DetectWait == 0:
		return DefaultDetectWait
	}
	return o.DetectWait
}

// Mode is how a connection carries its bytes.
type Mode struct {
	// SMC: over krcore, RDMA WRITEs into the peer's receive buffer.
	SMC bool
	// Pending: an accepted connection whose handshake has not finished
	// (Conn.Handshake waits for it).
	Pending bool
	// Reason is why the connection runs over TCP (ReasonNone if SMC).
	Reason Reason
	// Peer is the peer's reason when it declined (Reason is
	// ReasonPeerDeclined).
	Peer Reason
	// Err is the error behind Reason when this side's own step failed
	// (its queue, the peer's buffer, a CLC exchange); nil when the peer
	// declined (its error stays with it) or nothing failed.
	Err error
}

// String says "SMC" or "TCP" with the reason.
func (m Mode) String() string {
	switch {
	case m.Pending:
		return "pending"
	case m.SMC:
		return "SMC"
	case m.Reason == ReasonPeerDeclined:
		return fmt.Sprintf("TCP: %v: %v", m.Reason, m.Peer)
	case m.Err != nil:
		return fmt.Sprintf("TCP: %v: %v", m.Reason, m.Err)
	}
	return fmt.Sprintf("TCP: %v", m.Reason)
}

// ModeOf reports how c carries its bytes: a connection this package did
// not make is TCP with ReasonNoRuntime.
func ModeOf(c net.Conn) Mode {
	switch sc := c.(type) {
	case *Conn:
		return sc.Mode()
	case *rdmaConn:
		return Mode{SMC: true}
	case *tcpConn:
		return sc.mode
	}
	return Mode{Reason: ReasonNoRuntime}
}

// Errors of a connection besides the net package's.
var (
	// errAborted: the connection ended abnormally (the peer aborted or
	// vanished, or its RDMA failed); it matches syscall.ECONNRESET.
	errAborted = fmt.Errorf("smc: connection aborted: %w", syscall.ECONNRESET)
	// errPeerClosed: a write after the peer closed; it matches
	// syscall.EPIPE.
	errPeerClosed = fmt.Errorf("smc: peer closed the connection: %w", syscall.EPIPE)
	// errWriteShut: a write after CloseWrite or Close.
	errWriteShut = errors.New("smc: write after CloseWrite")
)

// Conn is an SMC connection or one that fell back to TCP: a net.Conn
// either way, whose TCP connection gives its addresses. Its methods are
// safe for concurrent use.
type Conn struct {
	tcp    *net.TCPConn
	node   *Node
	opts   Options
	server bool

	// decided is closed once the mode is known (mode is set before);
	// rxReady once reads may use the TCP connection, which the
	// detection of an accepted connection owns until then.
	decided, rxReady chan struct{}
	mode             Mode
	pre              []byte // the application's bytes read during detection
	hsErr            error  // a handshake that failed past the point of fallback
	stripCLC         bool   // a timed-out client: a late CLC reply may lead the stream
	acceptRest       []byte // what Accept could not write of its CLC accept (answerNow)

	dmu       sync.Mutex // sawBytes, committed: a server's detection
	sawBytes  bool
	committed bool          // a server write chose TCP before any bytes came
	firstByte chan struct{} // closed when sawBytes is set

	dlMu   sync.Mutex // rdT, wdT and applying them to tcp
	rdT    time.Time
	wdT    time.Time
	rd, wd deadline

	rdMu, wrMu sync.Mutex // one Read, one Write at a time
	closeOnce  sync.Once
	done       chan struct{} // closed by Close

	link    // the SMC side (data.go)
	popWait // a waiter popping the Node's port (pop.go)
}

func newConn(tc *net.TCPConn, opts *Options, server bool) *Conn {
	c := &Conn{tcp: tc, node: opts.Node, opts: *opts, server: server,
		decided: make(chan struct{}), rxReady: make(chan struct{}), firstByte: make(chan struct{}),
		done: make(chan struct{}), rd: makeDeadline(), wd: makeDeadline()}
	c.rxSig, c.txSig, c.kick = make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}, 1)
	c.rd.fired, c.wd.fired = c.interrupt, c.interrupt
	return c
}

// Mode reports how the connection carries its bytes.
func (c *Conn) Mode() Mode {
	select {
	case <-c.decided:
		return c.mode
	default:
		return Mode{Pending: true}
	}
}

// Handshake waits, within ctx, until the connection knows whether it runs
// over SMC or TCP. Dial returns connections that know; an accepted one
// learns once the client's first bytes (a proposal or not) are handled.
func (c *Conn) Handshake(ctx context.Context) error {
	select {
	case <-c.decided:
		return c.hsErr
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return net.ErrClosed
	}
}

// decide records the mode and lets writes (and, with rx, reads) proceed:
// the deadlines the application set so far now apply to the TCP
// connection if it carries the bytes.
func (c *Conn) decide(m Mode, rx bool) {
	if c.node != nil {
		c.node.settled(m)
	}
	c.dlMu.Lock()
	c.mode = m
	if !m.SMC {
		c.tcp.SetWriteDeadline(c.wdT)
		if rx {
			c.tcp.SetReadDeadline(c.rdT)
		}
	}
	close(c.decided)
	if rx {
		close(c.rxReady)
	}
	c.dlMu.Unlock()
}

// readyRx lets reads use the TCP connection, once the detection that
// owned it is done.
func (c *Conn) readyRx() {
	c.dlMu.Lock()
	if !c.mode.SMC {
		c.tcp.SetReadDeadline(c.rdT)
	}
	close(c.rxReady)
	c.dlMu.Unlock()
}

// Read reads up to len(p) bytes: what is in the receive buffer (SMC) or
// the TCP connection, at least one byte unless it fails.
func (c *Conn) Read(p []byte) (int, error) {
	c.rdMu.Lock()
	defer c.rdMu.Unlock()
	if err := c.readable(); err != nil {
		return 0, c.opErr("read", err)
	}
	if c.mode.SMC {
		n, err := c.readSMC(p)
		return n, c.opErr("read", err)
	}
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.tcp.Read(p)
}

// readable waits until reads may go (the mode is known and the detection
// let go of the TCP connection) and, over TCP, strips a late CLC answer
// off the stream; rdMu held.
func (c *Conn) readable() error {
	if err := c.wait(c.rxReady, c.rd.wait()); err != nil {
		return err
	}
	if c.hsErr != nil {
		return c.hsErr
	}
	if !c.mode.SMC && c.stripCLC {
		c.stripCLC = false
		c.stripLate()
	}
	return nil
}

// Write writes p whole unless it fails; over SMC it blocks while the
// peer's receive buffer is full.
func (c *Conn) Write(p []byte) (int, error) {
	if err := c.awaitWrite(); err != nil {
		return 0, c.opErr("write", err)
	}
	if c.hsErr != nil {
		return 0, c.opErr("write", c.hsErr)
	}
	if c.mode.SMC {
		c.wrMu.Lock()
		defer c.wrMu.Unlock()
		n, err := c.writeSMC(p)
		return n, c.opErr("write", err)
	}
	return c.tcp.Write(p)
}

// awaitWrite waits until writes may go. A server whose first write comes
// before any byte from the client waits DetectWait for them, then
// chooses TCP: a server-first protocol must not wait for a proposal that
// a plain TCP client never sends.
func (c *Conn) awaitWrite() error {
	select {
	case <-c.decided:
		return nil
	default:
	}
	if c.server {
		t := time.NewTimer(c.opts.detectWait())
		defer t.Stop()
		select {
		case <-c.decided:
			return nil
		case <-c.firstByte:
		case <-t.C:
			c.commitTCP()
		case <-c.wd.wait():
			return os.ErrDeadlineExceeded
		case <-c.done:
			return net.ErrClosed
		}
	}
	return c.wait(c.decided, c.wd.wait())
}

// commitTCP makes a server that has seen no byte from its client run over
// TCP, before it writes.
func (c *Conn) commitTCP() {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if c.sawBytes {
		return
	}
	c.committed = true
	c.decide(Mode{Reason: ReasonPeerNoSMC}, false)
}

// wait waits for ready, the deadline or Close.
func (c *Conn) wait(ready, dl <-chan struct{}) error {
	select {
	case <-ready:
		return nil
	default:
	}
	select {
	case <-ready:
		return nil
	case <-dl:
		return os.ErrDeadlineExceeded
	case <-c.done:
		return net.ErrClosed
	}
}

// opErr wraps err as the net package does, so that os.ErrDeadlineExceeded,
// net.ErrClosed and io.EOF keep matching (io.EOF is returned bare).
func (c *Conn) opErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return err
	}
	return &net.OpError{Op: op, Net: "smc", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// CloseWrite shuts the writing side: the peer reads every byte written
// before, then EOF, and can still write.
func (c *Conn) CloseWrite() error {
	select {
	case <-c.done:
		return c.opErr("close", net.ErrClosed)
	default:
	}
	if err := c.awaitWrite(); err != nil {
		return c.opErr("close", err)
	}
	if !c.mode.SMC {
		return c.tcp.CloseWrite()
	}
	c.wrMu.Lock()
	defer c.wrMu.Unlock()
	return c.opErr("close", c.shutWrite(flagDoneWriting))
}

// Close closes the connection: the peer reads every byte written before,
// then EOF; what waits here fails with net.ErrClosed.
func (c *Conn) Close() error {
	closed := true
	c.closeOnce.Do(func() {
		closed = false
		close(c.done)
		c.interrupt()
		if c.node != nil {
			c.node.untrack(c)
		}
		select {
		case <-c.decided:
		default:
			c.tcp.Close() // ends the detection or handshake
			<-c.decided
		}
		if c.mode.SMC {
			c.closeSMC()
			return
		}
		c.tcp.Close()
	})
	if closed {
		return c.opErr("close", net.ErrClosed)
	}
	return nil
}

// LocalAddr is the TCP connection's local address.
func (c *Conn) LocalAddr() net.Addr { return c.tcp.LocalAddr() }

// RemoteAddr is the TCP connection's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.tcp.RemoteAddr() }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

// SetReadDeadline bounds Read, including one blocked now; a time in the
// past fails reads at once, the zero time waits for ever.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.dlMu.Lock()
	defer c.dlMu.Unlock()
	c.rdT = t
	c.rd.set(t)
	if isClosed(c.rxReady) && !c.mode.SMC {
		return c.tcp.SetReadDeadline(t)
	}
	return nil
}

// SetWriteDeadline bounds Write, as SetReadDeadline bounds Read.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.dlMu.Lock()
	defer c.dlMu.Unlock()
	c.wdT = t
	c.wd.set(t)
	if isClosed(c.decided) && !c.mode.SMC {
		return c.tcp.SetWriteDeadline(t)
	}
	return nil
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// deadline is a deadline that waiters select on: its channel is closed
// once the time passes, and replaced when the deadline moves (as
// net.Pipe's).
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{}
	fired  func() // called once cancel closes (it ends a wait that does not watch it)
}

func makeDeadline() deadline { return deadline{cancel: make(chan struct{})} }

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait for its close
	}
	d.timer = nil
	closed := isClosed(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		ch := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(ch); d.fire() })
		return
	}
	if !closed {
		close(d.cancel)
		d.fire()
	}
}

func (d *deadline) fire() {
	if d.fired != nil {
		d.fired()
	}
}

func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}
