package soft

import (
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
		if q := n.lookupQP(f.dstQPN); q != nil {
			q.onResponse(f, r)
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
	return n.tcpRoute(addr, q)
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
