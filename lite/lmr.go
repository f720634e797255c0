package lite

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// LMR is a LITE memory region mastered by this Node. Its bytes live in
// pieces of memory on the nodes of its layout (this node alone, unless
// made by MallocOn or moved by Move).
type LMR struct {
	n     *Node
	name  string
	allow Perm
	// op is held by whatever changes the LMR's grants or layout (a Map's
	// grant, Unmap, Move, Free), never by serve.
	op     sync.Mutex
	freed  bool              // n.mu
	lay    layout            // n.mu
	pieces []string          // the piece on each node of lay, n.mu
	live   map[string]*grant // its grants, by export name, n.mu
	inDir  bool              // listed at the directory (dir.go), n.mu
	// shared is what nodes may Map it with beyond allow (perm.go), n.mu.
	shared map[krcore.NodeID]Perm
}

// grant is one mapper's permission on an LMR, exported on every node
// holding a piece under its own name (exportName) to the mapper's
// principal alone: its Node's node and port, which only that process's
// runtime vouches for, so no other process can look the grant up.
type grant struct {
	lmr    *LMR
	mapper krcore.Principal
	// lender, when set, lent its own grant parent's Read to mapper, the
	// holder of a Memcpy's dst (opLend): its rights bound the loan, it may
	// withdraw it, and withdrawing parent withdraws it.
	lender krcore.Principal
	parent string
	perm   Perm // what was granted, exported again on the new pieces by a Move
}

// owner is the principal whose rights the grant stands on and who may
// withdraw it: its lender, if lent, else its mapper.
func (g *grant) owner() krcore.Principal {
	if g.lender != (krcore.Principal{}) {
		return g.lender
	}
	return g.mapper
}

// exportName is the name a grant exp is exported under on the nodes of
// the layout of generation gen: a mapper derives it from both, and a
// grant of an old layout never names memory of a new one.
func exportName(exp string, gen uint32) string {
	return fmt.Sprintf("%s@%d", exp, gen)
}

// mapping is what a Handle stands for in the Node that mapped it. It is
// never changed once made: a new layout makes a new mapping.
type mapping struct {
	master  krcore.NodeID
	name    string // the LMR's
	export  string // the grant's
	lay     layout
	regions []krcore.Region // the grant on each node of lay, in its order
	// retired are the mappings this one replaced for its handle after
	// the LMR moved (remap), oldest first: calls begun before may still
	// use them, so their regions are forgotten with this one's.
	retired []*mapping
}

// forget drops the regions of the mapping and of those it replaced where
// the API keeps them (through krcored, the daemon's entries:
// krcore.Forget); none of them is used after.
func (m *mapping) forget() {
	for _, o := range append(m.retired, m) {
		for _, r := range o.regions {
			krcore.Forget(r)
		}
	}
}

// Handle names a mapping of an LMR. It is opaque and valid only in the
// Node that made it (Map): another Node refuses it with ErrBadHandle.
type Handle struct {
	n  *Node
	id uint64
}

// Malloc allocates size bytes as an LMR named name, mastered and held by
// this Node; allow is the permissions it grants to mappers. A name in use
// is ErrBusy.
func (n *Node) Malloc(ctx context.Context, name string, size int, allow Perm) (*LMR, error) {
	return n.MallocOn(ctx, name, size, allow, Placement{})
}

// newLMR reserves name for an LMR of layout lay and returns it with op
// held, so that no Map is granted before its pieces exist.
func (n *Node) newLMR(name string, allow Perm, lay layout) (*LMR, error) {
	if name == "" || len(name) > maxName || allow&^permAll != 0 {
		return nil, krcore.ErrInvalid
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.closed:
		return nil, krcore.ErrClosed
	case n.lmrs[name] != nil:
		return nil, krcore.ErrBusy
	}
	l := &LMR{n: n, name: name, allow: allow, lay: lay, live: map[string]*grant{}}
	l.op.Lock()
	n.lmrs[name] = l
	return l, nil
}

// publish releases op of an LMR newLMR made, whose memory is in place,
// and lists it at the directory; an LMR it cannot list is freed.
func (n *Node) publish(ctx context.Context, l *LMR) error {
	l.op.Unlock()
	if err := n.enlist(ctx, l); err != nil {
		l.Free()
		return err
	}
	return nil
}

// drop forgets an LMR whose making failed; op held.
func (l *LMR) drop() {
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	l.freed = true
	delete(l.n.lmrs, l.name)
}

// Bytes is the LMR's memory, for its master, while this node holds all of
// it; nil once freed, striped or moved to another node.
func (l *LMR) Bytes() []byte {
	n := l.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if l.freed || len(l.pieces) != 1 || l.lay.nodes[0] != n.api.Node() {
		return nil
	}
	if p := n.pieces[l.pieces[0]]; p != nil {
		return p.mr.Bytes()
	}
	return nil
}

// Nodes are the nodes holding the LMR's bytes, in stripe order.
func (l *LMR) Nodes() []krcore.NodeID {
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	return append([]krcore.NodeID(nil), l.lay.nodes...)
}

// Free withdraws every grant of the LMR, so that every handle on it fails
// from now on, then releases its memory on every node holding a piece.
// Freeing twice is ErrFreed.
func (l *LMR) Free() error {
	n := l.n
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout)
	defer cancel()
	l.op.Lock()
	defer l.op.Unlock()
	n.mu.Lock()
	if l.freed {
		n.mu.Unlock()
		return fmt.Errorf("lite: free %q: %w", l.name, ErrFreed)
	}
	l.freed = true
	delete(n.lmrs, l.name)
	for exp := range l.live {
		delete(n.grants, exp)
	}
	lay, ids := l.lay, l.pieces
	n.mu.Unlock()
	// Each holder withdraws the piece's grants before it frees it: no
	// READ sees freed memory.
	if err := errors.Join(n.unlist(l), n.dropPieces(ctx, lay.nodes, ids)); err != nil {
		return fmt.Errorf("lite: free %q: %w", l.name, err)
	}
	return nil
}

// dropPieces releases the pieces ids held by nodes.
func (n *Node) dropPieces(ctx context.Context, nodes []krcore.NodeID, ids []string) error {
	var errs []error
	for i, id := range ids {
		errs = append(errs, n.hold(ctx, nodes[i], opRelease, 0, id))
	}
	return errors.Join(errs...)
}

// grant answers a Map: it exports every piece of the LMR called name to
// mapper with exactly perm, if the LMR allows it, and returns the layout
// and the grant's export name.
func (n *Node) grant(ctx context.Context, mapper krcore.Principal, name string, perm Perm) (string, byte) {
	n.mu.Lock()
	l := n.lmrs[name]
	n.mu.Unlock()
	if l == nil {
		return "", codeFreed
	}
	l.op.Lock()
	defer l.op.Unlock()
	n.mu.Lock()
	switch {
	case l.freed:
		n.mu.Unlock()
		return "", codeFreed
	case perm == 0 || perm&^l.rights(mapper.Node) != 0:
		n.mu.Unlock()
		return "", codePerm
	}
	exp := grantName()
	lay, ids := l.lay, l.pieces
	n.mu.Unlock()
	g := &grant{lmr: l, mapper: mapper, perm: perm}
	if err := n.exportAll(ctx, lay, ids, exp, *g); err != nil {
		return "", codeFailed
	}
	n.mu.Lock()
	l.live[exp] = g
	n.grants[exp] = g
	n.mu.Unlock()
	return string(appendLayout(nil, lay, 0, slotSize-hdrLen-len(exp))) + exp, codeOK
}

// grantOp answers an opMap (from spawn: grant waits on the LMR).
func (n *Node) grantOp(ctx context.Context, from krcore.Principal, req ctlMsg) reply {
	ctx, cancel := context.WithTimeout(ctx, ctlTimeout)
	defer cancel()
	name, code := n.grant(ctx, from, req.name, req.perm)
	return reply{code: code, name: name}
}

// revokeOp answers an opUnmap (from spawn: revoke waits on the LMR).
func (n *Node) revokeOp(ctx context.Context, from krcore.Principal, req ctlMsg) reply {
	ctx, cancel := context.WithTimeout(ctx, ctlTimeout)
	defer cancel()
	return reply{code: n.revoke(ctx, from, req.name)}
}

// exportAll exports the grant g as exp on every piece ids of lay, or on
// none.
func (n *Node) exportAll(ctx context.Context, lay layout, ids []string, exp string, g grant) error {
	for i, id := range ids {
		if err := n.hold(ctx, lay.nodes[i], opGrant, g.perm, id, exportName(exp, lay.gen), principalBytes(g.mapper)); err != nil {
			n.unexportAll(ctx, lay, ids[:i], exportName(exp, lay.gen))
			return err
		}
	}
	return nil
}

// unexportAll withdraws the export name (every export: "") from the
// pieces ids of lay.
func (n *Node) unexportAll(ctx context.Context, lay layout, ids []string, name string) error {
	var errs []error
	for i, id := range ids {
		errs = append(errs, n.hold(ctx, lay.nodes[i], opRevoke, 0, id, name))
	}
	return errors.Join(errs...)
}

// revoke answers an Unmap: it withdraws the grant exported as exp, if
// from holds it (or lent it), and the loans made of it, on every piece.
func (n *Node) revoke(ctx context.Context, from krcore.Principal, exp string) byte {
	n.mu.Lock()
	g := n.grants[exp]
	n.mu.Unlock()
	if g == nil || g.owner() != from {
		return codeFreed
	}
	l := g.lmr
	l.op.Lock()
	defer l.op.Unlock()
	n.mu.Lock()
	if n.grants[exp] != g {
		n.mu.Unlock()
		return codeFreed
	}
	gone := []string{exp}
	for e, c := range l.live {
		if c.parent == exp {
			gone = append(gone, e)
		}
	}
	for _, e := range gone {
		delete(n.grants, e)
		delete(l.live, e)
	}
	lay, ids := l.lay, l.pieces
	n.mu.Unlock()
	var errs []error
	for _, e := range gone {
		errs = append(errs, n.unexportAll(ctx, lay, ids, exportName(e, lay.gen)))
	}
	if errors.Join(errs...) != nil {
		return codeFailed
	}
	return codeOK
}

// Map asks master for perm on the LMR called name and returns a handle on
// it. The master refuses a permission the LMR does not allow (ErrPerm) and
// an LMR it does not have (ErrFreed).
func (n *Node) Map(ctx context.Context, master krcore.NodeID, name string, perm Perm) (Handle, error) {
	if name == "" || len(name) > maxName || perm == 0 || perm&^permAll != 0 {
		return Handle{}, fmt.Errorf("lite: map %q with %b: %w", name, perm, krcore.ErrInvalid)
	}
	r, err := n.request(ctx, master, ctlMsg{kind: opMap, perm: perm, name: name})
	if err == nil {
		err = replyErr(r)
	}
	var m *mapping
	if err == nil {
		m, err = n.mapReply(ctx, master, name, r.name)
	}
	if err != nil {
		return Handle{}, fmt.Errorf("lite: map %q at node %d: %w", name, master, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seq++
	n.maps[n.seq] = m
	return Handle{n: n, id: n.seq}, nil
}

// mapReply makes the mapping a Map's reply body describes: the first
// page of the LMR's layout, then the grant's export name.
func (n *Node) mapReply(ctx context.Context, master krcore.NodeID, name, body string) (*mapping, error) {
	p, exp, ok := parseLayout([]byte(body))
	if !ok {
		return nil, errMalformed
	}
	return n.resolve(ctx, master, name, string(exp), p)
}

// lookup is the mapping h stands for in this Node.
func (n *Node) lookup(h Handle) (*mapping, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if m := n.maps[h.id]; h.n == n && m != nil {
		return m, nil
	}
	return nil, ErrBadHandle
}

// Unmap forgets h and tells the LMR's master, which withdraws the grant.
// An LMR freed already needs no withdrawal: Unmap then succeeds.
func (n *Node) Unmap(ctx context.Context, h Handle) error {
	m, err := n.take(h)
	if err != nil {
		return fmt.Errorf("lite: unmap: %w", err)
	}
	return n.withdraw(ctx, m)
}

// take removes the mapping h stands for from this Node and forgets its
// regions (Unmap's local half): from then on h is ErrBadHandle, and a
// remap under way forgets what it made (remap).
func (n *Node) take(h Handle) (*mapping, error) {
	n.mu.Lock()
	m := n.maps[h.id]
	if h.n != n || m == nil {
		n.mu.Unlock()
		return nil, ErrBadHandle
	}
	delete(n.maps, h.id)
	n.forgetLoans(m.master, m.export) // the master withdraws them with the grant
	n.mu.Unlock()
	m.forget()
	return m, nil
}

// withdraw asks the master of m, taken from its handle, to withdraw its
// grant (Unmap's remote half).
func (n *Node) withdraw(ctx context.Context, m *mapping) error {
	r, err := n.request(ctx, m.master, ctlMsg{kind: opUnmap, name: m.export})
	if err == nil && r.code != codeFreed {
		err = replyErr(r)
	}
	if err != nil {
		return fmt.Errorf("lite: unmap %q at node %d: %w", m.name, m.master, err)
	}
	return nil
}

// unmapAll tells, within bound, the masters of every grant this Node
// mapped to withdraw it (Close), without waiting for their answers, which
// a closed or dead master would never send: a grant left stays exported
// to this Node's principal, which a later process binding the port takes
// over. The handles stay, failing as the Node's queues close.
func (n *Node) unmapAll(bound time.Duration) {
	n.mu.Lock()
	masters := make([]krcore.NodeID, 0, len(n.maps))
	msgs := make([]ctlMsg, 0, len(n.maps))
	maps := make([]*mapping, 0, len(n.maps))
	for _, m := range n.maps {
		n.seq++
		masters = append(masters, m.master)
		msgs = append(msgs, ctlMsg{kind: opUnmap, id: n.seq, port: n.port, name: m.export})
		maps = append(maps, m)
	}
	n.mu.Unlock()
	for _, m := range maps {
		m.forget() // the handles fail from now on, as the Node's queues close
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	for i, m := range msgs {
		// Its loans go with it; a master that does not get it keeps the
		// grant until the LMR is freed.
		_ = n.sendRequest(ctx, masters[i], m)
	}
}

// Read copies len(buf) bytes at offset off of h's LMR into buf with RDMA
// READs.
func (n *Node) Read(ctx context.Context, h Handle, off int, buf []byte) error {
	return n.io(ctx, h, off, buf, verbs.OpRead)
}

// Write copies buf to offset off of h's LMR with RDMA WRITEs. The master's
// node refuses it (REM_ACCESS_ERR) unless h was mapped with Write.
func (n *Node) Write(ctx context.Context, h Handle, off int, buf []byte) error {
	return n.io(ctx, h, off, buf, verbs.OpWrite)
}

// io moves buf through the bounce buffer, one request per extent.
func (n *Node) io(ctx context.Context, h Handle, off int, buf []byte, op verbs.Opcode) error {
	admitted, err := n.qos.enter(ctx, len(buf))
	if err != nil {
		return fmt.Errorf("lite: %s: %w", op, err)
	}
	defer admitted.done()
	err = n.access(ctx, h, off, len(buf), func(m *mapping) error {
		n.dataMu.Lock()
		defer n.dataMu.Unlock()
		return n.transfer(ctx, m, off, buf, op)
	})
	if err != nil {
		return fmt.Errorf("lite: %s: %w", op, err)
	}
	return nil
}

// transfer moves buf to or from offset off of m's LMR, one request per
// extent; dataMu held.
func (n *Node) transfer(ctx context.Context, m *mapping, off int, buf []byte, op verbs.Opcode) error {
	var few [2]extent // most transfers are one extent: no allocation
	for _, e := range m.lay.appendExtents(few[:0], off, len(buf), bounceSize) {
		if err := n.chunk(ctx, m, e, op, buf[e.at:e.at+e.n]); err != nil {
			return fmt.Errorf("%q at %d: %w", m.name, off+e.at, err)
		}
	}
	return nil
}

// access runs fn on the mapping h stands for, once it checked that size
// bytes at offset off lie inside its LMR. Every operation on a handle
// goes through it, so that all see the same checks, and all are redone
// from their start on the new copy when the LMR moved under them: an
// operation is done whole on one copy, never half on each.
func (n *Node) access(ctx context.Context, h Handle, off, size int, fn func(m *mapping) error) error {
	m, err := n.lookup(h)
	for err == nil {
		if err = m.lay.fits(off, size); err == nil {
			err = ctx.Err()
		}
		if err == nil {
			err = fn(m)
		}
		if err == nil || !errors.Is(err, verbs.RemAccessErr) && !errors.Is(err, ErrFreed) {
			return err
		}
		// Refused at the responder (or, for a memop, by the holder): the
		// LMR may have moved (fn is then redone whole on the new copy), or
		// been freed.
		m, err = n.remap(ctx, h, m, err)
	}
	return err
}

// chunk moves the bytes of one extent, at most bounceSize; dataMu held.
func (n *Node) chunk(ctx context.Context, m *mapping, e extent, op verbs.Opcode, b []byte) error {
	if op == verbs.OpWrite {
		copy(n.bounce.Bytes(), b)
	}
	req := krcore.Request{ID: 1, Op: op, Local: n.bounce.Range(0, len(b)), Remote: m.regions[e.node].At(e.remote)}
	if err := n.post(ctx, m.lay.nodes[e.node], req); err != nil {
		return err
	}
	if op == verbs.OpRead {
		copy(b, n.bounce.Bytes())
	}
	return nil
}

// post runs one request on the data queue, connected to node, and waits
// for its completion; dataMu held. Its Local is the bounce buffer, which a
// request abandoned here (ctx ended) replaces, with the queue.
func (n *Node) post(ctx context.Context, node krcore.NodeID, req krcore.Request) error {
	if n.dataAt != node { // through krcored a Connect is a round trip
		if err := n.data.Connect(ctx, node, nil); err != nil {
			return err
		}
		n.dataAt = node
	}
	n.dataReq[0] = req
	if _, err := n.data.Push(ctx, true, n.dataReq[:]...); err != nil {
		return err
	}
	// A request to a node in this process often completes inside Push:
	// Pop takes it without PopWait's set-up for waiting.
	if n.data.Pop(n.dataOut[:]) == 0 {
		if _, err := n.data.PopWait(ctx, n.dataOut[:]); err != nil {
			n.renewData()
			return err
		}
	}
	return n.dataOut[0].Err()
}

// renewData replaces the data queue and the bounce buffer after a request
// was abandoned: it may still be in flight, and must neither pin the queue
// nor land in the buffer the next request uses; dataMu held.
func (n *Node) renewData() {
	n.data.Close()
	n.dataAt = 0
	n.api.Deregister(n.bounce) // released once the abandoned request ends
	if n.isClosed() {
		return // Close releases what is left
	}
	if q, err := n.api.Queue(); err == nil {
		n.qmu.Lock()
		n.data = q
		n.qmu.Unlock()
	}
	if b, err := n.api.RegMR(bounceSize, verbs.AccessLocalWrite); err == nil {
		n.bounce = b
	}
}
