package lite

import (
	"context"
	"errors"
	"fmt"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// LMR is a LITE memory region mastered by this Node.
type LMR struct {
	n     *Node
	name  string
	mr    krcore.MR
	allow Perm
	freed bool            // n.mu
	live  map[string]bool // export names of its grants, n.mu
	inDir bool            // listed at the directory (dir.go), n.mu
	// shared is what nodes may Map it with beyond allow (perm.go), n.mu.
	shared map[krcore.NodeID]Perm
}

// grant is one mapper's permission on an LMR, exported under its own name.
type grant struct {
	lmr    *LMR
	mapper krcore.NodeID
	perm   Perm // what the holder acts through it for (memops)
}

// mapping is what a Handle stands for in the Node that mapped it. It is
// never changed once made: a new layout makes a new mapping.
type mapping struct {
	master  krcore.NodeID
	name    string // the LMR's
	export  string // the grant's
	lay     layout
	regions []krcore.Region // the grant on each node of lay, in its order
}

// Handle names a mapping of an LMR. It is opaque and valid only in the
// Node that made it (Map): another Node refuses it with ErrBadHandle.
type Handle struct {
	n  *Node
	id uint64
}

// Malloc allocates size bytes as an LMR named name, mastered by this Node;
// allow is the permissions it grants to mappers. A name in use is ErrBusy.
func (n *Node) Malloc(ctx context.Context, name string, size int, allow Perm) (*LMR, error) {
	if name == "" || len(name) > maxName || size <= 0 || allow&^permAll != 0 {
		return nil, fmt.Errorf("lite: malloc %q of %d bytes allowing %b: %w", name, size, allow, krcore.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mr, err := n.api.RegMR(size, verbs.AccessAll)
	if err != nil {
		return nil, fmt.Errorf("lite: malloc %q: %w", name, err)
	}
	n.mu.Lock()
	switch {
	case n.closed:
		err = krcore.ErrClosed
	case n.lmrs[name] != nil:
		err = krcore.ErrBusy
	}
	if err != nil {
		n.mu.Unlock()
		n.api.Deregister(mr)
		return nil, fmt.Errorf("lite: malloc %q: %w", name, err)
	}
	l := &LMR{n: n, name: name, mr: mr, allow: allow, live: map[string]bool{}}
	n.lmrs[name] = l
	n.mu.Unlock()
	if err := n.enlist(ctx, l); err != nil {
		l.Free()
		return nil, fmt.Errorf("lite: malloc %q: %w", name, err)
	}
	return l, nil
}

// Bytes is the LMR's memory, for its master; nil once freed.
func (l *LMR) Bytes() []byte {
	return l.mr.Bytes()
}

// Free withdraws every grant of the LMR, so that every handle on it fails
// from now on, then releases its memory. Freeing twice is ErrFreed.
func (l *LMR) Free() error {
	n := l.n
	n.mu.Lock()
	if l.freed {
		n.mu.Unlock()
		return fmt.Errorf("lite: free %q: %w", l.name, ErrFreed)
	}
	l.freed = true
	delete(n.lmrs, l.name)
	var errs []error
	for exp := range l.live { // before Deregister: no READ sees freed memory
		delete(n.grants, exp)
		errs = append(errs, n.api.Unexport(exp))
	}
	n.mu.Unlock()
	errs = append(errs, n.unlist(l))
	errs = append(errs, n.api.Deregister(l.mr))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("lite: free %q: %w", l.name, err)
	}
	return nil
}

// grant answers a Map: it exports the LMR called name to mapper with
// exactly perm, if the LMR allows it.
func (n *Node) grant(mapper krcore.NodeID, name string, perm Perm) (string, byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.lmrs[name]
	switch {
	case l == nil:
		return "", codeFreed
	case perm == 0 || perm&^l.rights(mapper) != 0:
		return "", codePerm
	}
	exp := grantName()
	if err := n.api.Export(exp, l.mr, 0, l.mr.Len(), perm.access()); err != nil {
		return "", codeFailed
	}
	l.live[exp] = true
	n.grants[exp] = &grant{lmr: l, mapper: mapper, perm: perm}
	return exp, codeOK
}

// revoke answers an Unmap: it withdraws the grant exported as exp, if
// mapper holds it.
func (n *Node) revoke(mapper krcore.NodeID, exp string) byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	g := n.grants[exp]
	if g == nil || g.mapper != mapper {
		return codeFreed
	}
	delete(n.grants, exp)
	delete(g.lmr.live, exp)
	if n.api.Unexport(exp) != nil {
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
		err = codeErr(r.code)
	}
	if err != nil {
		return Handle{}, fmt.Errorf("lite: map %q at node %d: %w", name, master, err)
	}
	region, err := n.api.Region(ctx, master, r.name)
	if err != nil {
		return Handle{}, fmt.Errorf("lite: map %q at node %d: %w", name, master, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seq++
	n.maps[n.seq] = &mapping{master: master, name: name, export: r.name,
		lay: single(master, int(region.Len())), regions: []krcore.Region{region}}
	return Handle{n: n, id: n.seq}, nil
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
	m, err := n.lookup(h)
	if err != nil {
		return fmt.Errorf("lite: unmap: %w", err)
	}
	n.mu.Lock()
	delete(n.maps, h.id)
	n.mu.Unlock()
	r, err := n.request(ctx, m.master, ctlMsg{kind: opUnmap, name: m.export})
	if err == nil && r.code != codeFreed {
		err = codeErr(r.code)
	}
	if err != nil {
		return fmt.Errorf("lite: unmap %q at node %d: %w", m.name, m.master, err)
	}
	return nil
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
	err := n.access(ctx, h, off, len(buf), func(m *mapping) error {
		n.dataMu.Lock()
		defer n.dataMu.Unlock()
		for _, e := range m.lay.extents(off, len(buf), bounceSize) {
			if err := n.chunk(ctx, m, e, op, buf[e.at:e.at+e.n]); err != nil {
				return fmt.Errorf("%q at %d: %w", m.name, off+e.at, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lite: %s: %w", op, err)
	}
	return nil
}

// access runs fn on the mapping h stands for, once it checked that size
// bytes at offset off lie inside its LMR. Every operation on a handle
// goes through it, so that all see the same checks.
func (n *Node) access(ctx context.Context, h Handle, off, size int, fn func(m *mapping) error) error {
	m, err := n.lookup(h)
	if err == nil {
		err = m.lay.fits(off, size)
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return err
	}
	return fn(m)
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
	if err := n.data.Connect(ctx, node, nil); err != nil {
		return err
	}
	if _, err := n.data.Push(ctx, true, req); err != nil {
		return err
	}
	var out [1]krcore.Completion
	if _, err := n.data.PopWait(ctx, out[:]); err != nil {
		n.renewData()
		return err
	}
	return out[0].Err()
}

// renewData replaces the data queue and the bounce buffer after a request
// was abandoned: it may still be in flight, and must neither pin the queue
// nor land in the buffer the next request uses; dataMu held.
func (n *Node) renewData() {
	n.data.Close()
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
