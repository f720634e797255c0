package soft

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// redialAfter spaces out dials to a peer that just refused or failed.
const redialAfter = 20 * time.Millisecond

// tcpLink is the one TCP connection between this node and a peer node. All
// QPs between the two share it.
type tcpLink struct {
	node *Node
	addr string // the peer's fabric address

	// Guarded by node.linkMu.
	conn     net.Conn
	dialing  bool
	lastFail time.Time
	waiters  []*qp
	redial   *time.Timer // pumps waiters once redialAfter has passed

	dead atomic.Bool

	// The read role (read.go), guarded by rmu.
	rmu       sync.Mutex
	role      int
	rd        *linkReader // set by the background reader when it starts
	lentAt    int64       // node.now() when the role was last lent
	wanters   []*cq       // CQs whose waiters asked for the role
	yielders  []*cq       // CQs whose waiters gave the role up to wanters
	nwant     atomic.Int32
	kick      chan struct{} // wakes the background reader
	lendTimer *time.Timer   // the background reader's, while it waits

	wmu        sync.Mutex
	wbuf       []byte              // header plus small payloads, written in one call
	bufs       net.Buffers         // header plus large payload segments, for writev
	ack        [4 + headerLen]byte // a coalesced ACK not yet sent
	ackQPN     uint32              // the requester QP it acknowledges
	acks       int                 // ACKs folded into it
	ackPending atomic.Bool         // acks > 0, read without wmu
	ackBuf     [1][]byte           // l.ack as net.Buffers, without allocating
	wsock      *rawWriter          // non-blocking writes (write.go)
	queued     []chunk             // what the socket did not take yet
	draining   bool                // drain is running
	held       []*qp               // QPs whose pumps held off while it runs
}

func newTCPLink(n *Node, addr string) *tcpLink {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &tcpLink{node: n, addr: addr, kick: make(chan struct{}, 1), lendTimer: t}
}

// copyLimit is the payload size up to which a frame is copied into one
// buffer: cheaper than writev's per-segment cost for small messages.
const copyLimit = 4096

// maxCoalesce bounds how many ACKs one coalesced ACK stands for.
const maxCoalesce = 16

func (l *tcpLink) peer() string { return l.addr }

// send writes one frame, after any coalesced ACK, in one call.
func (l *tcpLink) send(f *frame) { l.sendBatch(f, nil) }

// sendBatch writes frames first and more, after any coalesced ACK, in one
// call: headers and small payloads copied into one buffer, large payload
// segments given to writev as they are, so a WRITE's data goes from
// registered memory to the socket without a copy.
func (l *tcpLink) sendBatch(first *frame, more []frame) {
	if l.dead.Load() {
		return
	}
	l.wmu.Lock()
	if need := len(l.ack) + (1+len(more))*(4+headerLen+copyLimit); cap(l.wbuf) < need {
		l.wbuf = make([]byte, 0, max(need, len(l.ack)+4+headerLen+copyLimit))
	}
	b := l.wbuf[:0] // never reallocated below: its capacity suffices
	if l.acks > 0 {
		b = append(b, l.ack[:]...)
		l.acks = 0
		l.ackPending.Store(false)
	}
	bufs := l.bufs[:0]
	start := 0
	for i := -1; i < len(more); i++ {
		f := first
		if i >= 0 {
			f = &more[i]
		}
		plen := f.payloadLen()
		off := len(b)
		b = b[:off+4+headerLen]
		f.putHeader(b[off:], plen)
		if plen <= copyLimit {
			for _, s := range f.segs {
				b = append(b, s...)
			}
			continue
		}
		bufs = append(bufs, b[start:])
		bufs = append(bufs, f.segs...)
		start = len(b)
	}
	if start < len(b) {
		bufs = append(bufs, b[start:])
	}
	err := l.writeLocked(bufs)
	clear(bufs)
	l.bufs = bufs[:0]
	l.wmu.Unlock()
	if err != nil {
		l.kill()
	}
}

// sendAck sends a plain ACK of an RC or DC WRITE or SEND lazily: ACKs are
// cumulative (an ACK acknowledges every earlier request of its QP, as on
// InfiniBand), so while more requests are buffered the link's reader
// folds their ACKs into one, sent before anything else the link sends,
// when the reader is about to wait, or after maxCoalesce.
func (l *tcpLink) sendAck(f *frame) {
	if l.dead.Load() {
		return
	}
	var err error
	l.wmu.Lock()
	if l.acks > 0 && l.ackQPN != f.dstQPN {
		err = l.writeAckLocked()
	}
	f.putHeader(l.ack[:], 0)
	l.ackQPN = f.dstQPN
	l.acks++
	l.ackPending.Store(true)
	if l.acks >= maxCoalesce && err == nil {
		err = l.writeAckLocked()
	}
	l.wmu.Unlock()
	if err != nil {
		l.kill()
	}
}

// flushAcks sends a coalesced ACK now.
func (l *tcpLink) flushAcks() {
	if !l.ackPending.Load() {
		return
	}
	l.wmu.Lock()
	err := l.writeAckLocked()
	l.wmu.Unlock()
	if err != nil {
		l.kill()
	}
}

// writeAckLocked writes the coalesced ACK, if any; l.wmu is held.
func (l *tcpLink) writeAckLocked() error {
	if l.acks == 0 {
		return nil
	}
	l.acks = 0
	l.ackPending.Store(false)
	if l.dead.Load() {
		return nil
	}
	l.ackBuf[0] = l.ack[:]
	return l.writeLocked(l.ackBuf[:])
}

// kill closes the link. Requests waiting on it time out with RETRY_EXC_ERR.
func (l *tcpLink) kill() {
	if l.dead.Swap(true) {
		return
	}
	n := l.node
	n.linkMu.Lock()
	if n.tcp[l.addr] == l {
		delete(n.tcp, l.addr)
	}
	if l.redial != nil {
		l.redial.Stop()
		l.redial = nil
	}
	c := l.conn
	n.linkMu.Unlock()
	if c != nil {
		shutdown(c)
	}
	l.rmu.Lock()
	if l.role == roleLent {
		n.lent.Add(-1)
	}
	l.role = roleDead
	for _, w := range l.wanters {
		w.ringBell() // they park elsewhere now
	}
	for _, w := range l.yielders {
		w.unyield.Store(true)
		w.ringBell()
	}
	l.rmu.Unlock()
	l.kickReader()
	l.lendTimer.Stop()
}

// shutdown ends a connection both ways without closing it: it may be
// called inside a read of the connection (a reader failing to answer), and
// Close would wait for that read to end. Whoever started the link's
// background reader closes the connection when it ends.
func shutdown(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseRead()
		tc.CloseWrite()
		return
	}
	c.Close()
}

// tcpRoute returns the up link to addr, or nil after making sure a dial is
// under way; q is pumped when the link comes up.
func (n *Node) tcpRoute(addr string, q *qp) link {
	n.linkMu.Lock()
	defer n.linkMu.Unlock()
	l := n.tcp[addr]
	if l != nil && l.conn != nil {
		return l
	}
	if l == nil {
		l = newTCPLink(n, addr)
		n.tcp[addr] = l
	}
	if q != nil && (len(l.waiters) == 0 || l.waiters[len(l.waiters)-1] != q) {
		l.waiters = append(l.waiters, q)
	}
	if l.dialing || n.closed.Load() {
		return nil
	}
	if wait := redialAfter - time.Since(l.lastFail); wait < 0 {
		l.dialing = true
		n.wg.Add(1)
		go n.dial(l)
	} else if l.redial == nil {
		// The last dial failed just now. Nothing else would dial
		// again: when both nodes dial at once the lower address
		// refuses the other's dial, and if its own then fails (seen:
		// connection refused under load) both wait for a link until
		// their requests time out.
		l.redial = time.AfterFunc(wait, func() { n.redial(l) })
	}
	return nil
}

// redial pumps the QPs waiting for l once redialAfter has passed since
// its dial failed: their pumps dial again.
func (n *Node) redial(l *tcpLink) {
	n.linkMu.Lock()
	l.redial = nil
	waiters := l.waiters
	l.waiters = nil
	n.linkMu.Unlock()
	for _, q := range waiters {
		q.pump()
	}
}

// dial connects to the link's peer and says hello.
func (n *Node) dial(l *tcpLink) {
	defer n.wg.Done()
	conn, err := net.DialTimeout("tcp", l.addr, n.cfg.DialTimeout)
	if err == nil {
		err = n.greet(conn)
	}
	n.linkMu.Lock()
	l.dialing = false
	if err != nil || l.conn != nil || n.closed.Load() {
		// Refused, failed, or the peer's own dial won the race.
		var waiters []*qp
		if err != nil {
			l.lastFail = time.Now()
			// The QPs waiting for the link look again: a UD
			// datagram to it is lost now rather than at its timeout.
			waiters, l.waiters = l.waiters, nil
		}
		n.linkMu.Unlock()
		if conn != nil {
			conn.Close()
		}
		for _, q := range waiters {
			q.pump()
		}
		return
	}
	l.conn = conn
	n.linkMu.Unlock()
	n.attach(l, conn)
}

// greet sends this node's hello on a dialled connection and reads the
// acceptor's verdict.
func (n *Node) greet(conn net.Conn) error {
	conn.SetDeadline(time.Now().Add(n.cfg.DialTimeout))
	defer conn.SetDeadline(time.Time{})
	if err := writeHello(conn, frameHello, 0, n.addr); err != nil {
		return err
	}
	var f frame
	var hdr [4 + headerLen]byte
	p, err := readFrame(conn, hdr[:], &f)
	if err != nil {
		return err
	}
	if f.typ != frameHelloAck {
		return fmt.Errorf("%w: expected hello-ack, got type %d", errFrame, f.typ)
	}
	if _, err := parseHello(p); err != nil {
		return err
	}
	if f.syn != 0 {
		return fmt.Errorf("soft: %s refused the link (one exists already)", conn.RemoteAddr())
	}
	return nil
}

func writeHello(w io.Writer, typ uint8, syn uint8, addr string) error {
	p := helloPayload(addr)
	f := frame{typ: typ, syn: syn}
	var hdr [4 + headerLen]byte
	f.putHeader(hdr[:], len(p))
	_, err := w.Write(append(hdr[:], p...))
	return err
}

// attach wakes the QPs waiting for a link that just got its connection and
// runs the link's reader until the connection ends.
func (n *Node) attach(l *tcpLink, conn net.Conn) {
	n.linkMu.Lock()
	waiters := l.waiters
	l.waiters = nil
	n.linkMu.Unlock()
	for _, q := range waiters {
		q.pump()
	}
	n.readLoop(l, conn)
}

// acceptEach serves every connection ln accepts, until ln closes. An
// accepted connection stays in n.accepts while serve runs, so Close can
// shut one that is still saying hello instead of waiting out its deadline.
func (n *Node) acceptEach(ln net.Listener, serve func(net.Conn)) {
	defer n.wg.Done()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return // the listener closed with the node
		}
		n.linkMu.Lock()
		if n.closed.Load() {
			n.linkMu.Unlock()
			conn.Close()
			return
		}
		n.accepts[conn] = struct{}{}
		n.wg.Add(1)
		n.linkMu.Unlock()
		go func() {
			defer n.wg.Done()
			serve(conn)
			n.linkMu.Lock()
			delete(n.accepts, conn)
			n.linkMu.Unlock()
		}()
	}
}

// serveConn takes a hello on an accepted connection and, if this node
// keeps it, reads the link.
func (n *Node) serveConn(conn net.Conn) {
	conn.SetDeadline(time.Now().Add(n.cfg.DialTimeout))
	var f frame
	var hdr [4 + headerLen]byte
	p, err := readFrame(conn, hdr[:], &f)
	if err == nil && f.typ != frameHello {
		err = fmt.Errorf("%w: expected hello, got type %d", errFrame, f.typ)
	}
	var peer string
	if err == nil {
		peer, err = parseHello(p)
	}
	if err != nil {
		conn.Close()
		return
	}
	l, keep := n.adopt(peer, conn)
	if !keep {
		writeHello(conn, frameHelloAck, 1, n.addr)
		conn.Close()
		return
	}
	if err := writeHello(conn, frameHelloAck, 0, n.addr); err != nil {
		l.kill()
		conn.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	n.attach(l, conn)
}

// adopt decides whether an incoming link from peer is kept: one link per
// node pair, and when both dial at once the lower address's dial wins.
func (n *Node) adopt(peer string, conn net.Conn) (*tcpLink, bool) {
	n.linkMu.Lock()
	defer n.linkMu.Unlock()
	l := n.tcp[peer]
	switch {
	case n.closed.Load():
		return nil, false
	case l != nil && l.conn != nil:
		return nil, false
	case l != nil && l.dialing && n.addr < peer:
		return nil, false
	case l == nil:
		l = newTCPLink(n, peer)
		n.tcp[peer] = l
	}
	l.conn = conn
	return l, true
}

// closeLinks closes every TCP connection, for Close.
func (n *Node) closeLinks() {
	n.linkMu.Lock()
	var links []*tcpLink
	for _, l := range n.tcp {
		links = append(links, l)
	}
	var conns []net.Conn
	for c := range n.accepts {
		conns = append(conns, c)
	}
	n.linkMu.Unlock()
	for _, c := range conns {
		shutdown(c) // their goroutines close them
	}
	for _, l := range links {
		l.kill()
	}
}

// BreakLinks closes every link of the node to other processes (TCP and
// shared memory) as a failing network would: requests in flight on them
// fail with RETRY_EXC_ERR after the retry timeout, and later requests dial
// new links.
func (n *Node) BreakLinks() {
	n.closeLinks()
	n.closeShm()
}
