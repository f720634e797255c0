package smc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/krcore/krcore"
)

// Listener serves SMC clients and plain TCP clients on one TCP port.
type Listener struct {
	tcp  *net.TCPListener
	opts Options
	rdma *rdmaListener // the kernel wire mode's (Options.RDMA)
	// noSMC: the kernel wire mode without the SMC option (RDMA.option):
	// every connection is TCP, with this error in its Mode.
	noSMC error
}

// Listen listens on the TCP address addr (network "tcp", "tcp4" or
// "tcp6"). opts may be nil: plain TCP, declining every proposal.
func Listen(network, addr string, opts *Options) (*Listener, error) {
	if opts == nil {
		opts = &Options{}
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	if opts.RDMA != nil {
		return listenRDMA(network, addr, opts)
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("smc: listen on %s: not TCP: %w", network, krcore.ErrInvalid)
	}
	return &Listener{tcp: tl, opts: *opts}, nil
}

// Accept returns the next connection at once: whether it runs over SMC
// is settled by its client's first bytes, in the background (see the
// package doc); its first Read or Write waits for that.
func (l *Listener) Accept() (net.Conn, error) {
	if l.rdma != nil {
		return l.rdma.accept()
	}
	tc, err := l.tcp.AcceptTCP()
	if err != nil {
		return nil, err
	}
	if l.noSMC != nil {
		return &tcpConn{tcp: tc, r: tc, mode: noAnnouncer(l.noSMC)}, nil
	}
	c := newConn(tc, &l.opts, true)
	if c.node != nil {
		c.node.track(c)
	}
	// Each goroutine is owned by c: Close ends it.
	switch p, err := c.proposalWaiting(); {
	case err != nil:
		// The cause by its text only: the connection's error matches
		// ECONNRESET (errAborted), never what a caller of Read takes
		// for a clean end (io.EOF). Mode.Err keeps the cause itself.
		c.hsErr = fmt.Errorf("smc: handshake: %v: %w", err, errAborted)
		c.tcp.Close()
		c.decide(Mode{Reason: ReasonSync, Err: err}, true)
	case p == nil:
		go c.detect()
	case c.answerNow(p):
		go c.awaitConfirm()
	default:
		go c.settleProposal(p)
	}
	return c, nil
}

// Close stops listening; accepted connections stay open.
func (l *Listener) Close() error {
	err := l.tcp.Close()
	if l.rdma != nil {
		l.rdma.close()
	}
	return err
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr { return l.tcp.Addr() }

// Dial connects to the SMC listener at addr; see DialContext.
func Dial(network, addr string, opts *Options) (net.Conn, error) {
	return DialContext(context.Background(), network, addr, opts)
}

// DialContext connects over TCP to addr and, with opts.Node set, proposes
// SMC on the TCP connection; it returns once the connection runs over SMC
// or fell back to TCP (ModeOf says which and why). ctx bounds the whole
// dial; its end fails the dial.
func DialContext(ctx context.Context, network, addr string, opts *Options) (net.Conn, error) {
	if opts == nil {
		opts = &Options{}
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	if opts.RDMA != nil {
		return dialRDMA(ctx, network, addr, opts)
	}
	tc, err := dialTCP(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := newConn(tc, opts, false)
	m := c.clientHandshake(ctx)
	if err := ctx.Err(); err != nil && !m.SMC {
		tc.Close()
		return nil, &net.OpError{Op: "dial", Net: "smc", Addr: tc.RemoteAddr(), Err: err}
	}
	if m.SMC {
		c.startSMC()
	}
	c.decide(m, true)
	if c.node != nil {
		c.node.track(c)
	}
	return c, nil
}

// clientHandshake proposes SMC, naming this side's port and token, and
// settles on the server's answer: an accept (confirmed, offering this
// side's buffer, once the server's is reachable), a decline, or bytes
// that are not CLC (the server spoke first: they are the application's).
func (c *Conn) clientHandshake(ctx context.Context) Mode {
	if c.node == nil {
		return Mode{Reason: ReasonNoRuntime}
	}
	if r, err := c.setupQueue(true); err != nil {
		c.releaseLocal()
		return Mode{Reason: r, Err: err}
	}
	hctx, cancel := c.bound(ctx)
	defer cancel()
	m, err := c.exchange(c.offer(clcProposal), clcAccept, clcDecline)
	switch {
	case err != nil:
		c.releaseLocal()
		return c.unanswered(err)
	case m.typ == clcDecline:
		c.releaseLocal()
		return Mode{Reason: ReasonPeerDeclined, Peer: m.reason}
	}
	r, err := c.setupPeer(hctx, m)
	if err != nil {
		c.decline(r)
		c.releaseLocal()
		return Mode{Reason: r, Err: err}
	}
	if _, err := c.tcp.Write(c.offer(clcConfirm).encode()); err != nil {
		c.releaseLocal()
		c.hsErr = fmt.Errorf("smc: handshake: send confirm (%v): %w", err, errAborted)
		return Mode{Reason: ReasonSync, Err: err}
	}
	return Mode{SMC: true}
}

// setupPeer connects this side's queue to the server's port named in its
// accept m, learns the server's buffer and takes this side's receive
// buffer (connectAlong).
func (c *Conn) setupPeer(ctx context.Context, m *clcMsg) (Reason, error) {
	return c.connectAlong(ctx, m, func() (Reason, error) { return c.learnAndTake(ctx, m) })
}

// connectAlong connects this side's queue to the peer's port named in m
// and runs the setup step g. A queue that must be made and connected (a
// first connection to the peer) is connected while g runs: through
// krcored that is two round trips to the daemon, as long as registering
// and exporting a slab.
func (c *Conn) connectAlong(ctx context.Context, m *clcMsg, g func() (Reason, error)) (Reason, error) {
	r, err := c.connectPeer(ctx, m, false)
	switch {
	case errors.Is(err, errWouldWait):
		return together(func() (Reason, error) { return c.connectPeer(ctx, m, true) }, g)
	case err != nil:
		return r, err
	}
	return g()
}

// learnAndTake learns the server's buffer from its accept m and takes
// this side's receive buffer. When the receive buffer needs a new slab
// (a first connection to the peer), the lookup runs meanwhile: through
// krcored the lookup and the slab's registration and export are each a
// round trip to the daemon, together most of a first connect.
func (c *Conn) learnAndTake(ctx context.Context, m *clcMsg) (Reason, error) {
	peer := krcore.Principal{Node: m.node, Port: m.port}
	if r, err := c.setupRMB(peer, false); !errors.Is(err, errWouldWait) {
		if err != nil {
			return r, err
		}
		return c.learnBuffer(ctx, m)
	}
	return together(
		func() (Reason, error) { return c.learnBuffer(ctx, m) },
		func() (Reason, error) { return c.setupRMB(peer, true) })
}

// together runs the setup steps f, in a goroutine of its own, and g, in
// this one, at once, and returns f's failure, else g's. They must touch
// different parts of the connection.
func together(f, g func() (Reason, error)) (Reason, error) {
	type result struct {
		r   Reason
		err error
	}
	fDone := make(chan result, 1)
	go func() { // owned by this call, which waits for it
		r, err := f()
		fDone <- result{r, err}
	}()
	r, err := g()
	if fr := <-fDone; fr.err != nil {
		return fr.r, fr.err
	}
	return r, err
}

// unanswered is the mode of a client whose proposal got no CLC answer:
// the server's bytes (kept for the application), a timeout (declined, and
// a late answer is stripped from the stream), or a broken connection.
func (c *Conn) unanswered(err error) Mode {
	var ne net.Error
	switch {
	case errors.Is(err, errNotCLC):
		return Mode{Reason: ReasonPeerNoSMC}
	case errors.Is(err, errVersion):
		c.decline(ReasonVersion)
		return Mode{Reason: ReasonVersion, Err: err}
	case errors.As(err, &ne) && ne.Timeout():
		c.decline(ReasonTimeout)
		c.stripCLC = true
		return Mode{Reason: ReasonTimeout, Err: err}
	}
	return Mode{Reason: ReasonPeerNoSMC, Err: err} // the read fails again for the application
}

// bound limits the handshake to HandshakeTimeout within ctx, on the TCP
// connection too; cancel lifts the TCP deadline.
func (c *Conn) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	hctx, cancel := context.WithTimeout(ctx, c.opts.handshakeTimeout())
	dl, _ := hctx.Deadline()
	c.tcp.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.tcp.SetDeadline(time.Unix(1, 0)) })
	return hctx, func() {
		stop()
		cancel()
		c.tcp.SetDeadline(time.Time{})
	}
}

// exchange sends out and reads the answer, one of types. Bytes that are
// not a CLC message are kept in c.pre for the application.
func (c *Conn) exchange(out *clcMsg, types ...byte) (*clcMsg, error) {
	if _, err := c.tcp.Write(out.encode()); err != nil {
		return nil, err
	}
	m, raw, err := readCLC(c.tcp, types...)
	if err != nil && !errors.Is(err, errVersion) {
		c.pre = raw
	}
	return m, err
}

// decline tells the peer why this side does not go on with SMC.
func (c *Conn) decline(r Reason) {
	var id uint64
	if c.node != nil {
		id = c.node.id
	}
	c.tcp.Write((&clcMsg{typ: clcDecline, peerID: id, reason: r}).encode())
}

// detect settles an accepted connection: it reads the client's first
// bytes and runs the server's handshake if they are a proposal. A server
// that wrote first (commitTCP) runs TCP whatever they are, and drops a
// proposal: its client saw the server's bytes first and fell back.
func (c *Conn) detect() {
	m, raw, err := readCLC(firstByteReader{c}, clcProposal)
	c.dmu.Lock()
	c.markSaw() // no commit from here on: this goroutine decides
	committed := c.committed
	c.dmu.Unlock()
	switch {
	case committed:
		if err != nil && !errors.Is(err, errVersion) {
			c.pre = raw
		}
		c.readyRx()
	case errors.Is(err, errVersion):
		c.decline(ReasonVersion)
		c.decide(Mode{Reason: ReasonVersion, Err: err}, true)
	case err != nil:
		c.pre = raw
		c.decide(Mode{Reason: ReasonPeerNoSMC}, true)
	default:
		c.settleProposal(m)
	}
}

// settleProposal runs the server's handshake on proposal p and settles
// the connection by its outcome.
func (c *Conn) settleProposal(p *clcMsg) {
	c.settleServer(c.serverHandshake(p))
}

// settleServer starts the SMC side of an accepted connection whose
// handshake ended in mode m, and records m; over SMC this goroutine (the
// handshake's own, never Accept's) then watches the TCP connection until
// it ends, instead of starting a goroutine for that.
func (c *Conn) settleServer(m Mode) {
	if m.SMC {
		c.beginSMC()
	}
	c.decide(m, true)
	if m.SMC {
		c.watchTCP()
	}
}

// serverHandshake answers a proposal: an accept offering a buffer
// exported to the client's endpoint alone, then the client's confirm
// (offering its buffer, exported to this side) or decline.
func (c *Conn) serverHandshake(p *clcMsg) Mode {
	if c.node == nil {
		c.decline(ReasonNoRuntime)
		return Mode{Reason: ReasonNoRuntime}
	}
	hctx, cancel := c.bound(context.Background())
	defer cancel()
	if r, err := c.prepareAccept(hctx, p, true); err != nil {
		c.decline(r)
		c.releaseLocal()
		return Mode{Reason: r, Err: err}
	}
	_, err := c.tcp.Write(c.offer(clcAccept).encode())
	return c.confirmation(hctx, err)
}

// prepareAccept takes what the accept names: a staging buffer, a token, a
// queue to the client's port and a receive buffer exported to it (with
// wait, a new queue connected while the buffer is taken: connectAlong).
// With wait false it fails with errWouldWait rather than register, export
// or connect anything.
func (c *Conn) prepareAccept(ctx context.Context, p *clcMsg, wait bool) (Reason, error) {
	peer := krcore.Principal{Node: p.node, Port: p.port}
	if r, err := c.setupQueue(wait); err != nil {
		return r, err
	}
	if wait {
		return c.connectAlong(ctx, p, func() (Reason, error) { return c.setupRMB(peer, true) })
	}
	if r, err := c.connectPeer(ctx, p, false); err != nil {
		return r, err
	}
	return c.setupRMB(peer, false)
}

// confirmation reads the client's answer to the accept (whose write failed
// with sent) and learns its buffer. A client that answers neither in
// time, or whose buffer cannot be found after it confirmed, breaks the
// connection: it may be writing already, so TCP is not safe; reads and
// writes fail and the client sees the TCP connection end.
func (c *Conn) confirmation(ctx context.Context, sent error) Mode {
	var m *clcMsg
	err := sent
	if err == nil {
		m, _, err = readCLC(c.tcp, clcConfirm, clcDecline)
	}
	switch {
	case err != nil:
		c.releaseFenced() // a confirm may come late, and WRITEs after it
		c.hsErr = fmt.Errorf("smc: handshake: no confirm from the client (%v): %w", err, errAborted)
		return Mode{Reason: ReasonSync, Err: err}
	case m.typ == clcDecline:
		c.releaseLocal()
		return Mode{Reason: ReasonPeerDeclined, Peer: m.reason}
	}
	if r, err := c.learnBuffer(ctx, m); err != nil {
		c.releaseFenced() // the client confirmed: it may be WRITEing
		c.tcp.Close()
		c.hsErr = fmt.Errorf("smc: handshake: the client's buffer (%v): %w", err, errAborted)
		return Mode{Reason: r, Err: err}
	}
	return Mode{SMC: true}
}

// proposalWaiting takes a client's proposal off the TCP connection if the
// whole of it is there already, without waiting, so that Accept can
// answer it itself: a connection handed to a goroutine to detect waits
// for that goroutine to run, a wake-up on a loaded machine, while the
// client waits for the answer. Nil when no whole proposal waits (nothing
// came yet, part of one, or bytes that are not one: the detection reads
// them as they are). An error: part of a proposal was taken, the
// connection is broken.
func (c *Conn) proposalWaiting() (*clcMsg, error) {
	if c.node == nil {
		return nil, nil
	}
	rc, err := c.tcp.SyscallConn()
	if err != nil {
		return nil, nil
	}
	var buf [clcMaxLen]byte
	var m *clcMsg
	var broken error
	rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != nil || n <= 0 {
			return true
		}
		p, raw, err := readCLC(bytes.NewReader(buf[:n]), clcProposal)
		if err != nil {
			return true
		}
		// The peeked bytes are in the socket: this read takes them all.
		switch k, _, err := syscall.Recvfrom(int(fd), buf[:len(raw)], syscall.MSG_DONTWAIT); {
		case err != nil:
			broken = fmt.Errorf("smc: reading the proposal's %d bytes: %w", len(raw), err)
		case k != len(raw):
			broken = fmt.Errorf("smc: the proposal's %d bytes read as %d: %w", len(raw), k, io.ErrUnexpectedEOF)
		default:
			m = p
		}
		return true
	})
	if m != nil || broken != nil {
		c.dmu.Lock()
		c.markSaw()
		c.dmu.Unlock()
	}
	return m, broken
}

// answerNow runs the server's handshake up to its accept in Accept's
// goroutine, for a proposal p that proposalWaiting took, when everything
// the accept names is at hand: false (nothing kept) when a buffer, a
// slab or a queue would have to be made, which the detection goroutine
// then does (a peer or krcored that is slow to answer must not hold up
// Accept).
func (c *Conn) answerNow(p *clcMsg) bool {
	if _, err := c.prepareAccept(context.Background(), p, false); err != nil {
		c.releaseLocal()
		return false
	}
	b := c.offer(clcAccept).encode()
	// One attempt that never waits: a fresh connection's socket buffer
	// takes a CLC message; what it does not take awaitConfirm writes.
	c.acceptRest = b
	if rc, err := c.tcp.SyscallConn(); err == nil {
		rc.Write(func(fd uintptr) bool {
			if n, err := syscall.Write(int(fd), b); err == nil && n > 0 {
				c.acceptRest = b[n:]
			}
			return true
		})
	}
	return true
}

// awaitConfirm is the rest of a handshake answerNow began: the accept's
// unsent bytes, then the client's confirm; it settles the connection.
func (c *Conn) awaitConfirm() {
	hctx, cancel := c.bound(context.Background())
	var err error
	if len(c.acceptRest) > 0 {
		_, err = c.tcp.Write(c.acceptRest)
	}
	c.acceptRest = nil
	m := c.confirmation(hctx, err)
	cancel()
	c.settleServer(m)
}

// markSaw records that bytes came from the client; dmu held.
func (c *Conn) markSaw() {
	if !c.sawBytes {
		c.sawBytes = true
		close(c.firstByte)
	}
}

// firstByteReader reads the TCP connection for detect and tells a waiting
// first Write that bytes came, so that it waits for the handshake instead
// of choosing TCP.
type firstByteReader struct{ c *Conn }

func (r firstByteReader) Read(p []byte) (int, error) {
	n, err := r.c.tcp.Read(p)
	if n > 0 {
		r.c.dmu.Lock()
		r.c.markSaw()
		r.c.dmu.Unlock()
	}
	return n, err
}

// stripLate reads a late CLC answer off the front of the stream of a
// client that timed out; anything else is the application's.
func (c *Conn) stripLate() {
	r := io.MultiReader(bytes.NewReader(c.pre), c.tcp)
	if _, raw, err := readCLC(r, clcAccept, clcDecline); err != nil {
		c.pre = raw
		return
	}
	c.pre = nil
}
