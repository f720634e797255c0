package soft

import (
	"bufio"
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

	dead atomic.Bool

	wmu  sync.Mutex
	wbuf []byte      // header plus small payloads, written in one call
	bufs net.Buffers // header plus large payload segments, for writev
}

// copyLimit is the payload size up to which a frame is copied into one
// buffer: cheaper than writev's per-segment cost for small messages.
const copyLimit = 4096

func (l *tcpLink) peer() string { return l.addr }

// send writes one frame: header and payload segments in one writev, so a
// WRITE's data goes from registered memory to the socket without a copy.
func (l *tcpLink) send(f *frame) {
	if l.dead.Load() {
		return
	}
	plen := f.payloadLen()
	l.wmu.Lock()
	if cap(l.wbuf) < 4+headerLen+copyLimit {
		l.wbuf = make([]byte, 4+headerLen, 4+headerLen+copyLimit)
	}
	hdr := l.wbuf[:4+headerLen]
	f.putHeader(hdr, plen)
	var err error
	if plen <= copyLimit {
		b := hdr
		for _, s := range f.segs {
			b = append(b, s...)
		}
		_, err = l.conn.Write(b)
	} else {
		l.bufs = append(append(l.bufs[:0], hdr), f.segs...)
		_, err = l.bufs.WriteTo(l.conn)
		l.bufs = l.bufs[:0:cap(l.bufs)]
	}
	l.wmu.Unlock()
	if err != nil {
		l.kill()
	}
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
	c := l.conn
	n.linkMu.Unlock()
	if c != nil {
		c.Close()
	}
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
		l = &tcpLink{node: n, addr: addr}
		n.tcp[addr] = l
	}
	if q != nil && (len(l.waiters) == 0 || l.waiters[len(l.waiters)-1] != q) {
		l.waiters = append(l.waiters, q)
	}
	if !l.dialing && time.Since(l.lastFail) > redialAfter && !n.closed.Load() {
		l.dialing = true
		n.wg.Add(1)
		go n.dial(l)
	}
	return nil
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
		if err != nil {
			l.lastFail = time.Now()
		}
		n.linkMu.Unlock()
		if conn != nil {
			conn.Close()
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

func (n *Node) acceptLoop() {
	defer n.wg.Done()
	for {
		conn, err := n.ln.Accept()
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
		go n.serveConn(conn)
	}
}

// serveConn takes a hello on an accepted connection and, if this node
// keeps it, reads the link.
func (n *Node) serveConn(conn net.Conn) {
	defer n.wg.Done()
	defer func() {
		n.linkMu.Lock()
		delete(n.accepts, conn)
		n.linkMu.Unlock()
	}()
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
		l = &tcpLink{node: n, addr: peer}
		n.tcp[peer] = l
	}
	l.conn = conn
	return l, true
}

// readLoop reads frames until the connection fails, then kills the link.
// Payloads go straight from the socket buffer into registered memory.
func (n *Node) readLoop(l *tcpLink, conn net.Conn) {
	defer l.kill()
	br := bufio.NewReaderSize(conn, 256<<10)
	var hdr [4 + headerLen]byte
	var f frame
	lr := &io.LimitedReader{R: br}
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		if err := decodeHeader(hdr[:], &f); err != nil || (f.typ != frameRequest && f.typ != frameResponse) {
			return // a malformed frame ends the link
		}
		lr.N = int64(f.plen)
		n.receive(l, &f, lr)
		if lr.N > 0 {
			if _, err := io.CopyN(io.Discard, lr, lr.N); err != nil {
				return
			}
		}
	}
}

// closeLinks closes every TCP connection, for Close.
func (n *Node) closeLinks() {
	n.linkMu.Lock()
	var links []*tcpLink
	for _, l := range n.tcp {
		links = append(links, l)
	}
	for c := range n.accepts {
		c.Close()
	}
	n.linkMu.Unlock()
	for _, l := range links {
		l.kill()
	}
}

// BreakLinks closes every TCP link of the node as a failing network would:
// requests in flight on them fail with RETRY_EXC_ERR after the retry
// timeout, and later requests dial new links.
func (n *Node) BreakLinks() { n.closeLinks() }
