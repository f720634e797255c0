package lite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// errMalformed: a reply that does not parse.
var errMalformed = errors.New("lite: malformed reply")

// Move moves the LMR's bytes to node, which then holds all of them, while
// mappers keep using their handles. It withdraws every grant on the old
// copy first: an operation the old copy's holder served before completed
// there, a later one is refused (REM_ACCESS_ERR) and its mapper, once it
// learnt the new layout from this master (which answers after the move),
// redoes the whole operation on the new copy. So each operation completes
// whole on one copy, the old one before the move or the new one after
// it. The master copies the bytes through its data path, then grants
// every mapper on the new copy what it had, then frees the old pieces (or
// leaves a Registered MR to its caller). Maps, Unmaps and Frees of the LMR
// wait for the move. On failure the old copy stays the LMR's.
func (l *LMR) Move(ctx context.Context, node krcore.NodeID) error {
	n := l.n
	if node == 0 {
		return fmt.Errorf("lite: move %q to node 0: %w", l.name, krcore.ErrInvalid)
	}
	l.op.Lock()
	defer l.op.Unlock()
	n.mu.Lock()
	old, oldIDs, grants, freed := l.lay, l.pieces, maps.Clone(l.live), l.freed
	n.mu.Unlock()
	switch {
	case freed:
		return fmt.Errorf("lite: move %q: %w", l.name, ErrFreed)
	case len(old.nodes) == 1 && old.nodes[0] == node:
		return nil
	}
	nu := single(node, old.size)
	nu.gen = old.gen + 1
	ids := n.pieceIDs(1)
	if err := n.hold(ctx, node, opAlloc, 0, ids[0], sizeBytes(old.size)); err != nil {
		n.orphans(ctx, nu.nodes, ids) // the piece may exist: the reply was what failed
		return fmt.Errorf("lite: move %q to node %d: %w", l.name, node, err)
	}
	err := n.unexportAll(ctx, old, oldIDs, "")
	if err == nil {
		err = n.copyLMR(ctx, old, oldIDs, nu, ids)
	}
	for exp, g := range grants {
		if err == nil {
			err = n.exportAll(ctx, nu, ids, exp, *g)
		}
	}
	if err != nil {
		l.moveBack(ctx, old, oldIDs, nu, ids, grants)
		return fmt.Errorf("lite: move %q to node %d: %w", l.name, node, err)
	}
	n.mu.Lock()
	l.lay, l.pieces = nu, ids
	n.mu.Unlock()
	if err := n.dropPieces(ctx, old.nodes, oldIDs); err != nil {
		return fmt.Errorf("lite: move %q to node %d: moved, but freeing the old copy: %w", l.name, node, err)
	}
	return nil
}

// orphans releases pieces whose allocation may have succeeded unanswered
// (ctx ended), on a context of its own.
func (n *Node) orphans(ctx context.Context, nodes []krcore.NodeID, ids []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ctlTimeout)
	defer cancel()
	n.dropPieces(ctx, nodes, ids)
}

// moveBack undoes a Move that failed after it withdrew the grants on the
// old copy: the new pieces ids go, and the old pieces oldIDs are granted
// again, as a layout of the new generation, so that a mapper whose
// operation the move refused learns it and redoes it there; op held.
func (l *LMR) moveBack(ctx context.Context, old layout, oldIDs []string, nu layout, ids []string, grants map[string]*grant) {
	n := l.n
	n.orphans(ctx, nu.nodes, ids)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ctlTimeout) // ctx may be what ended
	defer cancel()
	back := old
	back.gen = nu.gen
	for exp, g := range grants {
		n.exportAll(ctx, back, oldIDs, exp, *g)
	}
	n.mu.Lock()
	l.lay = back
	n.mu.Unlock()
}

// copyLMR copies an LMR's bytes from the pieces oldIDs of layout old to
// the pieces ids of layout nu, through a grant of its own on both.
func (n *Node) copyLMR(ctx context.Context, old layout, oldIDs []string, nu layout, ids []string) error {
	exp := grantName() // Read and Write on the LMR: as secret as a mapper's grant
	self := n.api.Node()
	if err := n.exportAll(ctx, old, oldIDs, exp, grant{mapper: n.principal(), perm: Read}); err != nil {
		return err
	}
	defer n.unexportAll(ctx, old, oldIDs, exportName(exp, old.gen))
	if err := n.exportAll(ctx, nu, ids, exp, grant{mapper: n.principal(), perm: Write}); err != nil {
		return err
	}
	defer n.unexportAll(ctx, nu, ids, exportName(exp, nu.gen))
	from, err := n.mapping(ctx, self, "", exp, old)
	if err != nil {
		return err
	}
	defer from.forget()
	to, err := n.mapping(ctx, self, "", exp, nu)
	if err != nil {
		return err
	}
	defer to.forget()
	buf := make([]byte, bounceSize)
	n.dataMu.Lock()
	defer n.dataMu.Unlock()
	for off := 0; off < old.size; off += bounceSize {
		b := buf[:min(bounceSize, old.size-off)]
		if err := n.transfer(ctx, from, off, b, verbs.OpRead); err != nil {
			return err
		}
		if err := n.transfer(ctx, to, off, b, verbs.OpWrite); err != nil {
			return err
		}
	}
	return nil
}

// mapping makes the mapping of the grant exp on layout lay: it looks up
// the region on every node.
func (n *Node) mapping(ctx context.Context, master krcore.NodeID, name, exp string, lay layout) (*mapping, error) {
	m := &mapping{master: master, name: name, export: exp, lay: lay}
	for _, node := range lay.nodes {
		r, err := n.region(ctx, node, exportName(exp, lay.gen))
		if err != nil {
			m.forget()
			return nil, err
		}
		m.regions = append(m.regions, r)
	}
	return m, nil
}

// resolve makes the mapping of the grant exp on the LMR called name from
// the first page p of its layout: it fetches the rest of the layout, then
// the regions. An LMR that moved meanwhile is looked up again.
func (n *Node) resolve(ctx context.Context, master krcore.NodeID, name, exp string, p page) (*mapping, error) {
	for {
		lay, err := n.complete(ctx, master, exp, p)
		if err != nil {
			return nil, err
		}
		m, err := n.mapping(ctx, master, name, exp, lay)
		if !errors.Is(err, krcore.ErrNoRegion) {
			return m, err
		}
		// The master answers after the move that withdrew the region.
		q, qerr := n.askLayout(ctx, master, exp, 0)
		if qerr != nil {
			return nil, qerr
		}
		if q.gen == lay.gen {
			return nil, err
		}
		p = q
	}
}

// complete gathers a layout from its pages, starting from p, asking the
// master for the next page until it has every node; a page of a newer
// layout (the LMR moved meanwhile) starts it again.
func (n *Node) complete(ctx context.Context, master krcore.NodeID, exp string, p page) (layout, error) {
	var lay layout
	total := -1
	for {
		switch {
		case p.first == 0:
			lay, total = p.layout, p.total
		case total >= 0 && p.gen == lay.gen && p.first == len(lay.nodes):
			lay.nodes = append(lay.nodes, p.nodes...)
		default:
			total = -1
		}
		if total == 0 {
			return layout{}, errMalformed
		}
		if total > 0 && len(lay.nodes) == total {
			return lay, nil
		}
		from := 0
		if total > 0 {
			from = len(lay.nodes)
		}
		var err error
		if p, err = n.askLayout(ctx, master, exp, from); err != nil {
			return layout{}, err
		}
	}
}

// askLayout asks master for the layout of the LMR the grant exp is on,
// from its node with index from.
func (n *Node) askLayout(ctx context.Context, master krcore.NodeID, exp string, from int) (page, error) {
	body := string(binary.LittleEndian.AppendUint16(nil, uint16(from))) + exp
	r, err := n.request(ctx, master, ctlMsg{kind: opLayout, name: body})
	if err == nil {
		err = replyErr(r)
	}
	if err != nil {
		return page{}, fmt.Errorf("layout of %q at node %d: %w", exp, master, err)
	}
	p, _, ok := parseLayout([]byte(r.name))
	if !ok {
		return page{}, fmt.Errorf("layout of %q at node %d: %w", exp, master, errMalformed)
	}
	return p, nil
}

// layoutOp answers an opLayout (from spawn: layoutFor waits on the LMR).
func (n *Node) layoutOp(_ context.Context, from krcore.Principal, req ctlMsg) reply {
	name, code := n.layoutFor(from, req.name)
	return reply{code: code, name: name}
}

// layoutFor answers an opLayout from mapper: the layout of the LMR its
// grant is on, from the node with the index the body starts with. It
// waits for a Move under way, so the mapper learns the new layout.
func (n *Node) layoutFor(mapper krcore.Principal, body string) (string, byte) {
	if len(body) < 2 {
		return "", codeFailed
	}
	from, exp := int(binary.LittleEndian.Uint16([]byte(body))), body[2:]
	n.mu.Lock()
	g := n.grants[exp]
	n.mu.Unlock()
	if g == nil || g.mapper != mapper {
		return "", codeFreed
	}
	g.lmr.op.Lock()
	defer g.lmr.op.Unlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	lay := g.lmr.lay
	switch {
	case n.grants[exp] != g:
		return "", codeFreed
	case from > len(lay.nodes):
		return "", codeFailed
	}
	return string(appendLayout(nil, lay, from, slotSize-hdrLen)), codeOK
}

// remap answers an operation on h's mapping m that failed with cause
// (REM_ACCESS_ERR): if the LMR moved, it maps the new layout and returns
// it, for the operation to be redone; if it was freed, the error says so
// too; else cause stands.
func (n *Node) remap(ctx context.Context, h Handle, m *mapping, cause error) (*mapping, error) {
	p, err := n.askLayout(ctx, m.master, m.export, 0)
	switch {
	case errors.Is(err, ErrFreed):
		return nil, fmt.Errorf("%w (%w)", cause, ErrFreed)
	case err != nil:
		return nil, fmt.Errorf("%w; then asking for the layout: %w", cause, err)
	case p.gen == m.lay.gen:
		return nil, cause
	}
	nm, err := n.resolve(ctx, m.master, m.name, m.export, p)
	if err != nil {
		return nil, err
	}
	// An Unmap of h (or the Node's Close) meanwhile forgot only the
	// mappings it found: what this remap made is forgotten here.
	n.mu.Lock()
	cur, closed := n.maps[h.id], n.closed
	if cur != nil && !closed {
		nm.retired = append(cur.retired[:len(cur.retired):len(cur.retired)], cur)
		n.maps[h.id] = nm
	}
	n.mu.Unlock()
	switch {
	case closed:
		nm.forget()
		return nil, fmt.Errorf("%w; then remapping: %w", cause, krcore.ErrClosed)
	case cur == nil:
		nm.forget()
		return nil, fmt.Errorf("%w; then remapping: %w", cause, ErrBadHandle)
	}
	n.redone.Add(1)
	return nm, nil
}
