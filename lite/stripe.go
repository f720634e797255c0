package lite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// layout says where an LMR's bytes live: size bytes cut into stripes of
// stripe bytes, dealt round-robin over nodes, each node holding its
// stripes back to back in one piece of memory. gen counts the layouts the
// LMR had: a Move makes a new one.
type layout struct {
	gen    uint32
	size   int
	stripe int
	nodes  []krcore.NodeID
}

// single is the layout of size bytes held whole by node.
func single(node krcore.NodeID, size int) layout {
	return layout{size: size, stripe: size, nodes: []krcore.NodeID{node}}
}

// locate maps offset off of the LMR to the index of the node holding it,
// the offset in that node's piece, and the bytes left in its stripe.
func (l layout) locate(off int) (node, at, left int) {
	if off < l.stripe { // the first stripe, all of an LMR on one node: no division
		return 0, off, l.stripe - off
	}
	s := off / l.stripe
	k := len(l.nodes)
	return s % k, s/k*l.stripe + off%l.stripe, l.stripe - off%l.stripe
}

// extent is the part of an operation on an LMR one request serves: n
// bytes at offset at of the operation's buffer, at remote in the piece of
// the node with index node in the layout.
type extent struct {
	node   int
	remote uint64
	at, n  int
}

// extents cuts size bytes at offset off of the LMR at stripe boundaries
// and into extents of at most max bytes.
func (l layout) extents(off, size, max int) []extent {
	return l.appendExtents(nil, off, size, max)
}

// appendExtents is extents appending to out.
func (l layout) appendExtents(out []extent, off, size, max int) []extent {
	for at := 0; at < size; {
		node, remote, left := l.locate(off + at)
		k := min(size-at, left, max)
		out = append(out, extent{node: node, remote: uint64(remote), at: at, n: k})
		at += k
	}
	return out
}

// fits checks that size bytes at offset off lie inside the LMR.
func (l layout) fits(off, size int) error {
	if off < 0 || size < 0 || off > l.size || size > l.size-off {
		return fmt.Errorf("%d bytes at %d of %d: %w", size, off, l.size, krcore.ErrInvalid)
	}
	return nil
}

// maxNodes bounds the nodes an LMR is striped over.
const maxNodes = 64

// Placement says where an LMR's bytes live (MallocOn).
type Placement struct {
	// Nodes hold the LMR, each one piece of memory, distinct; the
	// stripes are dealt to them round-robin in this order. Empty is this
	// node alone.
	Nodes []krcore.NodeID
	// Stripe is the stripe size in bytes, a multiple of 8 (so that no
	// 8-byte atomic word straddles two nodes); 0 cuts the LMR into one
	// stripe per node, of equal size but the last.
	Stripe int
}

// layout is the layout p gives size bytes on this node (self).
func (p Placement) layout(self krcore.NodeID, size int) (layout, error) {
	nodes := p.Nodes
	if len(nodes) == 0 {
		nodes = []krcore.NodeID{self}
	}
	stripe := p.Stripe
	if stripe == 0 {
		stripe = (size + len(nodes) - 1) / len(nodes)
		stripe = (stripe + 7) &^ 7
	}
	seen := map[krcore.NodeID]bool{}
	for _, id := range nodes {
		if id == 0 || seen[id] {
			return layout{}, fmt.Errorf("node %d twice or zero in %v: %w", id, nodes, krcore.ErrInvalid)
		}
		seen[id] = true
	}
	l := layout{size: size, stripe: stripe, nodes: nodes}
	switch {
	case size <= 0, stripe <= 0, stripe%8 != 0 && len(nodes) > 1, len(nodes) > maxNodes:
		return layout{}, fmt.Errorf("%d bytes in stripes of %d over %d nodes: %w", size, stripe, len(nodes), krcore.ErrInvalid)
	case (size+stripe-1)/stripe < len(nodes):
		return layout{}, fmt.Errorf("%d bytes in stripes of %d leave a node of %d without one: %w", size, stripe, len(nodes), krcore.ErrInvalid)
	}
	return l, nil
}

// pieceLen is the length of the piece the node with index i holds.
func (l layout) pieceLen(i int) int {
	if len(l.nodes) == 1 {
		return l.size
	}
	stripes := (l.size + l.stripe - 1) / l.stripe
	k := len(l.nodes)
	n := (stripes - i + k - 1) / k * l.stripe
	if last := stripes - 1; last%k == i {
		n -= stripes*l.stripe - l.size
	}
	return n
}

// layoutHdr is the length of a layout's encoding before its nodes: gen(4)
// size(8) stripe(8) total nodes(2) first node(2) nodes here(1).
const layoutHdr = 25

// appendLayout appends l and as many of its nodes from index first as
// fit in room bytes.
func appendLayout(b []byte, l layout, first, room int) []byte {
	k := max(0, min(len(l.nodes)-first, (room-layoutHdr)/8))
	le := binary.LittleEndian
	b = le.AppendUint32(b, l.gen)
	b = le.AppendUint64(b, uint64(l.size))
	b = le.AppendUint64(b, uint64(l.stripe))
	b = le.AppendUint16(b, uint16(len(l.nodes)))
	b = le.AppendUint16(b, uint16(first))
	b = append(b, byte(k))
	for _, id := range l.nodes[first : first+k] {
		b = le.AppendUint64(b, id)
	}
	return b
}

// page is part of a layout as a message carries it: its nodes from
// index first of total.
type page struct {
	layout
	first, total int
}

// parseLayout reads what appendLayout wrote and returns the rest of b.
func parseLayout(b []byte) (page, []byte, bool) {
	if len(b) < layoutHdr {
		return page{}, nil, false
	}
	le := binary.LittleEndian
	p := page{layout: layout{gen: le.Uint32(b), size: int(le.Uint64(b[4:])), stripe: int(le.Uint64(b[12:]))},
		total: int(le.Uint16(b[20:])), first: int(le.Uint16(b[22:]))}
	k := int(b[24])
	b = b[layoutHdr:]
	if len(b) < 8*k || p.size <= 0 || p.stripe <= 0 || p.first+k > p.total {
		return page{}, nil, false
	}
	for i := range k {
		p.nodes = append(p.nodes, le.Uint64(b[8*i:]))
	}
	return p, b[8*k:], true
}

// holding is a piece of memory this Node holds for an LMR mastered by
// master.
type holding struct {
	master krcore.Principal
	mr     krcore.MR
	own    bool // the caller's memory (Register): released, never deregistered
}

// export is a grant on a piece held here, exported under its name for
// mapper with exactly perm: what the holder acts through for that mapper
// (memops), besides what its RNIC lets the mapper do.
type export struct {
	piece  *holding
	mapper krcore.Principal
	perm   Perm
}

// pack joins parts, each at most 255 bytes, into a message body.
func pack(parts ...string) string {
	var b []byte
	for _, p := range parts {
		b = append(append(b, byte(len(p))), p...)
	}
	return string(b)
}

// unpack splits a body pack made into k parts.
func unpack(s string, k int) ([]string, bool) {
	out := make([]string, 0, k)
	for range k {
		if len(s) == 0 || len(s) < 1+int(s[0]) {
			return nil, false
		}
		out = append(out, s[1:1+int(s[0])])
		s = s[1+int(s[0]):]
	}
	return out, len(s) == 0
}

// hold asks node to do a piece operation (opAlloc, opGrant, opRevoke,
// opRelease) for an LMR this Node masters: itself, when it is node.
func (n *Node) hold(ctx context.Context, node krcore.NodeID, kind byte, perm Perm, parts ...string) error {
	body := pack(parts...)
	var r reply
	if node == n.api.Node() {
		r = n.pieceOp(n.principal(), kind, perm, body)
	} else {
		var err error
		if r, err = n.request(ctx, node, ctlMsg{kind: kind, perm: perm, name: body}); err != nil {
			return fmt.Errorf("piece op %#x at node %d: %w", kind, node, err)
		}
	}
	if err := replyErr(r); err != nil {
		return fmt.Errorf("piece op %#x at node %d: %w", kind, node, err)
	}
	return nil
}

// spawnPieceOp runs a piece operation as spawn does, but after the piece
// operations that came before it: a master sends them in order (alloc,
// then the release of a move it gave up), and one overtaking another at
// the holder (a release before the alloc it undoes) would leave a piece
// nobody frees. Called by serve alone, which owns pieceTail.
func (n *Node) spawnPieceOp(ctx context.Context, from krcore.Principal, req ctlMsg) {
	prev, next := n.pieceTail, make(chan struct{})
	n.pieceTail = next
	n.spawn(ctx, from, req, func(ctx context.Context, from krcore.Principal, req ctlMsg) reply {
		defer close(next)
		if prev != nil {
			<-prev // it ends: spawn's goroutines finish when ctx does
		}
		return n.pieceReq(ctx, from, req)
	})
}

// pieceReq answers a piece operation from another node (from spawn:
// Unexport and Deregister wait for the copies in flight through the
// memory, which serve must not).
func (n *Node) pieceReq(_ context.Context, from krcore.Principal, req ctlMsg) reply {
	return n.pieceOp(from, req.kind, req.perm, req.name)
}

// pieceOp does a piece operation master asked for: opAlloc(id, size)
// allocates a piece, opGrant(id, export, mapper) exports it for mapper
// with exactly perm, opRevoke(id, export) withdraws one export ("": all),
// opRelease(id) withdraws every export, then frees the piece. Only the
// principal (a master's Node) that allocated a piece can use it.
func (n *Node) pieceOp(master krcore.Principal, kind byte, perm Perm, body string) reply {
	k := map[byte]int{opAlloc: 2, opGrant: 3, opRevoke: 2, opRelease: 1}[kind]
	parts, ok := unpack(body, k)
	if !ok {
		return failure(codeInvalid, "piece op %#x: malformed", kind)
	}
	if kind == opAlloc {
		return n.alloc(master, parts[0], parts[1])
	}
	n.mu.Lock()
	p := n.pieces[parts[0]]
	if p == nil || p.master != master {
		n.mu.Unlock()
		return reply{code: codeFreed}
	}
	if kind == opGrant {
		n.mu.Unlock()
		return n.exportPiece(p, parts[1], parts[2], perm)
	}
	var names []string
	for name, e := range n.exports {
		if e.piece == p && (kind == opRelease || parts[1] == "" || parts[1] == name) {
			names = append(names, name)
			delete(n.exports, name) // memops stop using it from now on
		}
	}
	if kind == opRelease {
		delete(n.pieces, parts[0])
	}
	n.mu.Unlock()
	return p.withdraw(n.api, names, kind == opRelease)
}

// exportPiece answers an opGrant: it exports p as name to the principal
// mapper (principalBytes) alone, with exactly perm.
func (n *Node) exportPiece(p *holding, name, mapper string, perm Perm) reply {
	to, ok := parsePrincipal(mapper)
	if !ok {
		return failure(codeInvalid, "grant: malformed mapper")
	}
	if err := n.api.Export(name, p.mr, 0, p.mr.Len(), perm.access(), to); err != nil {
		return failure(codeFailed, "grant: %v", err)
	}
	n.mu.Lock()
	n.exports[name] = &export{piece: p, mapper: to, perm: perm}
	n.mu.Unlock()
	return reply{code: codeOK}
}

// withdraw unexports names, then deregisters the piece if free and the
// memory is not the caller's: no mapper's request reads freed memory.
func (p *holding) withdraw(api krcore.API, names []string, free bool) reply {
	var errs []error
	for _, e := range names {
		errs = append(errs, api.Unexport(e))
	}
	if free && !p.own {
		errs = append(errs, api.Deregister(p.mr))
	}
	if err := errors.Join(errs...); err != nil {
		return failure(codeFailed, "withdraw: %v", err)
	}
	return reply{code: codeOK}
}

// alloc answers an opAlloc: a piece of size bytes (8, little endian) for
// master, under id.
func (n *Node) alloc(master krcore.Principal, id, size string) reply {
	if len(size) != 8 {
		return failure(codeInvalid, "alloc: malformed size")
	}
	k := binary.LittleEndian.Uint64([]byte(size))
	if k == 0 || k > 1<<40 {
		return failure(codeInvalid, "alloc of %d bytes", k)
	}
	mr, err := n.api.RegMR(int(k), verbs.AccessAll)
	if err != nil {
		return failure(codeFailed, "alloc of %d bytes: %v", k, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.pieces[id] != nil {
		n.api.Deregister(mr)
		return failure(codeBusy, "alloc: piece %q exists or the Node closed", id)
	}
	n.pieces[id] = &holding{master: master, mr: mr}
	return reply{code: codeOK}
}

// releasePieces frees every piece this Node holds, at Close.
func (n *Node) releasePieces() {
	n.mu.Lock()
	ps, exps := n.pieces, n.exports
	n.pieces, n.exports = map[string]*holding{}, map[string]*export{}
	n.mu.Unlock()
	names := map[*holding][]string{}
	for name, e := range exps {
		names[e.piece] = append(names[e.piece], name)
	}
	for _, p := range ps {
		p.withdraw(n.api, names[p], true)
	}
}

// principalBytes encodes a principal for a message body: its node and
// port, little endian.
func principalBytes(p krcore.Principal) string {
	return string(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint64(nil, p.Node), p.Port))
}

// parsePrincipal decodes what principalBytes made.
func parsePrincipal(s string) (krcore.Principal, bool) {
	if len(s) != 12 {
		return krcore.Principal{}, false
	}
	b := []byte(s)
	return krcore.Principal{Node: binary.LittleEndian.Uint64(b), Port: binary.LittleEndian.Uint32(b[8:])}, true
}

// sizeBytes encodes a piece's size for opAlloc.
func sizeBytes(k int) string {
	return string(binary.LittleEndian.AppendUint64(nil, uint64(k)))
}

// MallocOn allocates size bytes as an LMR named name, mastered by this
// Node, whose bytes live where p says: striped over p.Nodes, each of
// which allocates its piece when this Node asks and enforces the rights
// of every grant on it (a mapper's requests go straight to the node
// holding each stripe). Reads and Writes through a handle are cut at
// stripe boundaries. A name in use is ErrBusy.
func (n *Node) MallocOn(ctx context.Context, name string, size int, allow Perm, p Placement) (*LMR, error) {
	lay, err := p.layout(n.api.Node(), size)
	var l *LMR
	if err == nil {
		err = ctx.Err()
	}
	if err == nil {
		l, err = n.newLMR(name, allow, lay)
	}
	if err != nil {
		return nil, fmt.Errorf("lite: malloc %q of %d bytes allowing %b: %w", name, size, allow, err)
	}
	ids := n.pieceIDs(len(lay.nodes))
	for i, node := range lay.nodes {
		if err := n.hold(ctx, node, opAlloc, 0, ids[i], sizeBytes(lay.pieceLen(i))); err != nil {
			n.orphans(ctx, lay.nodes, ids[:i+1])
			l.drop()
			l.op.Unlock()
			return nil, fmt.Errorf("lite: malloc %q: %w", name, err)
		}
	}
	n.mu.Lock()
	l.pieces = ids
	n.mu.Unlock()
	if err := n.publish(ctx, l); err != nil {
		return nil, fmt.Errorf("lite: malloc %q: %w", name, err)
	}
	return l, nil
}

// pieceIDs names k new pieces: unique among the pieces any node holds
// (this node and port, and a sequence number).
func (n *Node) pieceIDs(k int) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	ids := make([]string, k)
	for i := range ids {
		n.seq++
		ids[i] = fmt.Sprintf("%d.%d/%d", n.api.Node(), n.port, n.seq)
	}
	return ids
}
