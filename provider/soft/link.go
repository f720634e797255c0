package soft

import (
	"bytes"
	"io"
	"strings"
	"sync"
)

// link carries frames to one peer node. send hands a frame over; on the
// in-memory wire the peer handles it (and any response comes back) before
// send returns. Senders never hold a QP lock across send.
type link interface {
	send(f *frame)
	peer() string
}

// memLink is the in-memory wire from one node to another.
type memLink struct {
	from, to *Node
	back     *memLink
}

func (l *memLink) peer() string { return l.to.addr }

func (l *memLink) send(f *frame) {
	if l.to.closed.Load() || l.from.closed.Load() {
		return // a dead node answers nothing: the requester times out
	}
	f.plen = uint32(f.payloadLen())
	f.rd = segReader{segs: f.segs}
	l.to.receive(l.back, f, &f.rd)
}

// segReader reads a frame's outbound segments, so the receiver copies
// straight from the sender's registered memory.
type segReader struct{ segs [][]byte }

func (s *segReader) Read(p []byte) (int, error) {
	n := 0
	for len(p) > 0 && len(s.segs) > 0 {
		c := copy(p, s.segs[0])
		p, n = p[c:], n+c
		if s.segs[0] = s.segs[0][c:]; len(s.segs[0]) == 0 {
			s.segs = s.segs[1:]
		}
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// receive dispatches a frame that arrived on lk.
func (n *Node) receive(lk link, f *frame, r io.Reader) {
	switch f.typ {
	case frameRequest:
		n.serve(lk, f, r)
	case frameResponse:
		if n.holding.Load() && n.hold(f, r) {
			return
		}
		n.deliver(f, r)
	}
}

// deliver hands a response to the QP it is addressed to.
func (n *Node) deliver(f *frame, r io.Reader) {
	if q := n.lookupQP(f.dstQPN); q != nil {
		q.onResponse(f, r)
	}
}

// heldResponse is a response HoldResponses keeps back: its header and a
// copy of its payload.
type heldResponse struct {
	f       frame
	payload []byte
}

// HoldResponses makes the node keep every response that arrives for its
// QPs (READ data, atomic results, ACKs and NAKs) instead of handing it to
// the QP, until the returned release is called, which hands them over in
// the order they arrived. It is fault injection, for tests: a slow
// network or responder, so requests stay outstanding for as long as a test
// needs (they still time out with RETRY_EXC_ERR after the QP's timeout).
// held reports how many responses are held; release may be called more
// than once.
func (n *Node) HoldResponses() (held func() int, release func()) {
	n.holdMu.Lock()
	n.holding.Store(true)
	n.holdMu.Unlock()
	return n.heldCount, n.releaseHeld
}

// heldCount is how many responses HoldResponses holds now.
func (n *Node) heldCount() int {
	n.holdMu.Lock()
	defer n.holdMu.Unlock()
	return len(n.held)
}

// hold keeps a response back while HoldResponses is in force, reporting
// whether it did.
func (n *Node) hold(f *frame, r io.Reader) bool {
	n.holdMu.Lock()
	defer n.holdMu.Unlock()
	if !n.holding.Load() {
		return false
	}
	h := heldResponse{f: *f, payload: make([]byte, f.plen)}
	h.f.segs, h.f.held, h.f.rd = nil, nil, segReader{}
	if _, err := io.ReadFull(r, h.payload); err != nil {
		return true // a truncated frame: its link is dying anyway
	}
	n.held = append(n.held, h)
	return true
}

// releaseHeld hands the held responses over in arrival order, and those
// that arrive meanwhile after them, then stops holding.
func (n *Node) releaseHeld() {
	for {
		n.holdMu.Lock()
		batch := n.held
		n.held = nil
		if len(batch) == 0 {
			n.holding.Store(false)
			n.holdMu.Unlock()
			return
		}
		n.holdMu.Unlock()
		for i := range batch {
			h := &batch[i]
			h.f.plen = uint32(len(h.payload))
			n.deliver(&h.f, bytes.NewReader(h.payload))
		}
	}
}

// memLinks caches in-memory links by peer address.
type memLinks struct {
	mu sync.RWMutex
	m  map[string]*memLink
}

// route returns the link to addr, or nil while none is up: a TCP link
// being dialled (q is pumped when it comes up) or an address nobody
// answers (q's requests time out).
func (n *Node) route(addr string, q *qp) link {
	n.mem.mu.RLock()
	l := n.mem.m[addr]
	n.mem.mu.RUnlock()
	if l != nil && !l.to.closed.Load() {
		return l
	}
	if addr == n.addr {
		return n.memLinkTo(n) // loopback never leaves the NIC
	}
	if peer := n.fab.lookup(addr); peer != nil {
		return n.memLinkTo(peer)
	}
	if strings.HasPrefix(addr, "mem:") || addr == "" {
		return nil
	}
	if lk, ok := n.shmRoute(addr, q); ok {
		return lk
	}
	return n.tcpRoute(addr, q)
}

// unreachable reports that no link to addr is up or coming (route found
// none): no node of the in-memory fabric has it, or the last dial of the
// TCP link to it failed and none is in progress.
func (n *Node) unreachable(addr string) bool {
	if addr == "" || strings.HasPrefix(addr, "mem:") {
		return addr != n.addr && n.fab.lookup(addr) == nil
	}
	n.linkMu.Lock()
	defer n.linkMu.Unlock()
	l := n.tcp[addr]
	return l != nil && l.conn == nil && !l.dialing && !l.lastFail.IsZero()
}

// linkComing reports whether a link to addr is being set up: a TCP
// connect or a shared-memory hello under way.
func (n *Node) linkComing(addr string) bool {
	n.linkMu.Lock()
	defer n.linkMu.Unlock()
	s, t := n.shm[addr], n.tcp[addr]
	return s != nil && s.dialing || t != nil && t.dialing
}

// memLinkTo makes (or finds) the in-memory link pair between n and peer.
func (n *Node) memLinkTo(peer *Node) *memLink {
	n.mem.mu.Lock()
	defer n.mem.mu.Unlock()
	if l := n.mem.m[peer.addr]; l != nil && l.to == peer {
		return l
	}
	l := &memLink{from: n, to: peer}
	l.back = &memLink{from: peer, to: n, back: l}
	n.mem.m[peer.addr] = l
	return l
}
