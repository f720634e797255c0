package smc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
	go c.detect() // owned by c: Close ends it
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
	if opts.RDMA != nil {
		return dialRDMA(ctx, network, addr, opts)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("smc: dial %s: not TCP: %w", network, krcore.ErrInvalid)
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
	if r, err := c.setupQueue(); err != nil {
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
	r, err := c.connectPeer(hctx, m)
	if err == nil {
		r, err = c.learnBuffer(hctx, m)
	}
	if err == nil {
		r, err = c.setupRMB(krcore.Principal{Node: m.node, Port: m.port})
	}
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
		mode := c.serverHandshake(m)
		if mode.SMC {
			c.startSMC()
		}
		c.decide(mode, true)
	}
}

// serverHandshake answers a proposal: an accept offering a buffer
// exported to the client's endpoint alone, then the client's confirm
// (offering its buffer, exported to this side) or decline. A client that
// answers neither in time, or whose buffer cannot be found after it
// confirmed, breaks the connection: it may be writing already, so TCP is
// not safe; reads and writes fail and the client sees the TCP connection
// end.
func (c *Conn) serverHandshake(p *clcMsg) Mode {
	if c.node == nil {
		c.decline(ReasonNoRuntime)
		return Mode{Reason: ReasonNoRuntime}
	}
	hctx, cancel := c.bound(context.Background())
	defer cancel()
	r, err := c.setupQueue()
	if err == nil {
		r, err = c.connectPeer(hctx, p)
	}
	if err == nil {
		r, err = c.setupRMB(krcore.Principal{Node: p.node, Port: p.port})
	}
	if err != nil {
		c.decline(r)
		c.releaseLocal()
		return Mode{Reason: r, Err: err}
	}
	m, err := c.exchange(c.offer(clcAccept), clcConfirm, clcDecline)
	switch {
	case err != nil:
		c.releaseLocal()
		c.pre = nil
		c.hsErr = fmt.Errorf("smc: handshake: no confirm from the client (%v): %w", err, errAborted)
		return Mode{Reason: ReasonSync, Err: err}
	case m.typ == clcDecline:
		c.releaseLocal()
		return Mode{Reason: ReasonPeerDeclined, Peer: m.reason}
	}
	if r, err := c.learnBuffer(hctx, m); err != nil {
		c.releaseLocal()
		c.tcp.Close()
		c.hsErr = fmt.Errorf("smc: handshake: the client's buffer (%v): %w", err, errAborted)
		return Mode{Reason: r, Err: err}
	}
	return Mode{SMC: true}
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
