package lite

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/krcore/krcore"
)

// The permissions beyond moving bytes, which the master checks itself: a
// mapping with Share may pass its rights on to another node (Share), one
// with Admin may act as the master: free the LMR (Node.Free) and change
// who may map it how (Node.SetPerm).
const (
	Share Perm = Atomic << (1 + iota)
	Admin
)

// Control op kinds of Share and Admin, and of a Memcpy's loan (this
// file's range: 0x48-0x4b).
const (
	opShare byte = 0x48 + iota
	opFree
	opSetPerm
	opLend
)

// grantName is a fresh export name for a grant. The grant is exported to
// its mapper's principal alone, whose runtime alone can look it up; the
// name is random (128 bits) besides, and only the master and the mapper's
// Node, which never shows it, learn it.
func grantName() string {
	return "lite/" + rand.Text()
}

// rights is what mapper may Map l with: what l allows every node, and
// what its master, an admin or a sharer gave mapper; n.mu held.
func (l *LMR) rights(mapper krcore.NodeID) Perm {
	return l.allow | l.shared[mapper]
}

// SetPerm sets what node may Map l with, beyond what l allows every node;
// node 0 sets what l allows every node. Grants beyond what their mapper
// may now have are withdrawn: their handles fail as on a freed LMR, and
// their mappers Map again with less.
func (l *LMR) SetPerm(node krcore.NodeID, perm Perm) error {
	if perm&^permAll != 0 {
		return fmt.Errorf("lite: set permissions %b on %q: %w", perm, l.name, krcore.ErrInvalid)
	}
	n := l.n
	l.op.Lock()
	defer l.op.Unlock()
	n.mu.Lock()
	if l.freed {
		n.mu.Unlock()
		return fmt.Errorf("lite: set permissions on %q: %w", l.name, ErrFreed)
	}
	gone := l.entitle(node, perm)
	n.mu.Unlock()
	if err := l.withdraw(gone); err != nil {
		return fmt.Errorf("lite: set permissions on %q: %w", l.name, err)
	}
	return nil
}

// withdraw unexports the grants exps, which entitle took away, from every
// piece of l; op held.
func (l *LMR) withdraw(exps []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout)
	defer cancel()
	l.n.mu.Lock()
	lay, ids := l.lay, l.pieces
	l.n.mu.Unlock()
	var errs []error
	for _, exp := range exps {
		errs = append(errs, l.n.unexportAll(ctx, lay, ids, exportName(exp, lay.gen)))
	}
	return errors.Join(errs...)
}

// entitle sets node's rights on l (node 0: every node's) and forgets the
// grants beyond them, whose export names it returns for withdraw; op and
// n.mu held.
func (l *LMR) entitle(node krcore.NodeID, perm Perm) []string {
	if node == 0 {
		l.allow = perm
	} else {
		if l.shared == nil {
			l.shared = map[krcore.NodeID]Perm{}
		}
		l.shared[node] = perm
	}
	var gone []string
	for exp, g := range l.live {
		if g.perm&^l.rights(g.owner().Node) != 0 {
			delete(l.n.grants, exp)
			delete(l.live, exp)
			gone = append(gone, exp)
		}
	}
	return gone
}

// Share lets node Map h's LMR with perm, at most h's own rights, which must
// include Share: the master records the right, and node then Maps the LMR
// (by name) as if the LMR allowed it perm.
func (n *Node) Share(ctx context.Context, h Handle, node krcore.NodeID, perm Perm) error {
	if node == 0 || perm == 0 || perm&^permAll != 0 {
		return fmt.Errorf("lite: share %b with node %d: %w", perm, node, krcore.ErrInvalid)
	}
	return n.admin(ctx, "share", h, ctlMsg{kind: opShare, perm: perm}, node)
}

// Free frees h's LMR at its master, which h must have Admin on; every
// handle on it fails from then on, as after the master's LMR.Free.
func (n *Node) Free(ctx context.Context, h Handle) error {
	return n.admin(ctx, "free", h, ctlMsg{kind: opFree}, 0)
}

// SetPerm sets, at the master, what node may Map h's LMR with (node 0:
// every node), as LMR.SetPerm does; h must have Admin.
func (n *Node) SetPerm(ctx context.Context, h Handle, node krcore.NodeID, perm Perm) error {
	if perm&^permAll != 0 {
		return fmt.Errorf("lite: set permissions %b: %w", perm, krcore.ErrInvalid)
	}
	return n.admin(ctx, "set permissions", h, ctlMsg{kind: opSetPerm, perm: perm}, node)
}

// admin sends m, naming node and h's grant, to h's master and waits for
// the answer.
func (n *Node) admin(ctx context.Context, what string, h Handle, m ctlMsg, node krcore.NodeID) error {
	mp, err := n.lookup(h)
	if err != nil {
		return fmt.Errorf("lite: %s: %w", what, err)
	}
	m.name = string(binary.AppendUvarint(nil, node)) + mp.export
	r, err := n.request(ctx, mp.master, m)
	if err == nil {
		err = replyErr(r)
	}
	if err != nil {
		return fmt.Errorf("lite: %s %q at node %d: %w", what, mp.name, mp.master, err)
	}
	return nil
}

// execAdmin answers a Share, Free or SetPerm from principal from: it acts
// only if the grant the request names is from's and holds the permission.
func (n *Node) execAdmin(ctx context.Context, from krcore.Principal, req ctlMsg) reply {
	if req.kind == opLend {
		return n.execLend(ctx, from, req)
	}
	b := []byte(req.name)
	node, k := binary.Uvarint(b)
	if k <= 0 {
		return failure(codeInvalid, "malformed request")
	}
	exp := string(b[k:])
	if req.perm&^permAll != 0 || (req.kind == opShare && (node == 0 || req.perm == 0)) {
		return failure(codeInvalid, "share or set %b for node %d", req.perm, node)
	}
	need := Admin
	if req.kind == opShare {
		need = Share
	}
	n.mu.Lock()
	g := n.grants[exp]
	n.mu.Unlock()
	if g != nil && req.kind != opFree { // Free takes op itself
		g.lmr.op.Lock() // no grant is made or moved while rights change
		defer g.lmr.op.Unlock()
	}
	var gone []string
	n.mu.Lock()
	if n.grants[exp] != g { // withdrawn meanwhile
		g = nil
	}
	switch {
	case g == nil || g.lmr.freed:
		n.mu.Unlock()
		return failure(codeFreed, "grant %q withdrawn", exp)
	case g.mapper != from || g.perm&need == 0:
		n.mu.Unlock()
		return failure(codePerm, "grant %q does not give node %d port %d %b", exp, from.Node, from.Port, need)
	case req.kind == opShare && req.perm&^g.perm != 0:
		n.mu.Unlock()
		return failure(codePerm, "node %d shares %b holding %b", from.Node, req.perm, g.perm)
	case req.kind == opShare:
		gone = g.lmr.entitle(node, g.lmr.shared[node]|req.perm)
	case req.kind == opSetPerm:
		gone = g.lmr.entitle(node, req.perm)
	}
	n.mu.Unlock()
	if err := g.lmr.withdraw(gone); err != nil {
		return failure(codeFailed, "%v", err)
	}
	if req.kind == opFree {
		if err := g.lmr.Free(); errors.Is(err, ErrFreed) {
			return failure(codeFreed, "%v", err)
		} else if err != nil {
			return failure(codeFailed, "%v", err)
		}
	}
	return reply{}
}

// lend asks m's master to lend Read on m's LMR to the principal to (the
// Node holding a Memcpy's dst bytes, which READs src) through a grant of
// its own, exported to to alone: Memcpy's delegation is this one
// operation. It returns the loan's export name; the master withdraws the
// loan with m's grant (Unmap), or when the caller asks. A grant of an
// older layout than the LMR's is refused as withdrawn (ErrFreed), so the
// caller maps the new one.
func (n *Node) lend(ctx context.Context, m *mapping, to krcore.Principal) (string, error) {
	b := binary.AppendUvarint(nil, to.Node)
	b = binary.AppendUvarint(b, uint64(to.Port))
	b = binary.AppendUvarint(b, uint64(m.lay.gen))
	r, err := n.request(ctx, m.master, ctlMsg{kind: opLend, perm: Read, name: string(b) + m.export})
	if err == nil {
		err = replyErr(r)
	}
	if err != nil {
		return "", fmt.Errorf("lend %q to node %d port %d: %w", m.name, to.Node, to.Port, err)
	}
	return r.name, nil
}

// loanName is a fresh export name for a loan by lender: a grant's name
// that says whose loan it is, so that the borrower acts through it only
// for lender (lenderOf). Only a master names exports to a borrower, and
// it names a loan so only for the lender it checked.
func loanName(lender krcore.Principal) string {
	return fmt.Sprintf("%s/loan/%d.%d", grantName(), lender.Node, lender.Port)
}

// lenderOf is the lender a loan's export name (loanName, with or without
// its generation) names; false for any other name.
func lenderOf(name string) (krcore.Principal, bool) {
	if i := strings.LastIndexByte(name, '@'); i >= 0 {
		name = name[:i]
	}
	_, tail, ok := strings.Cut(name, "/loan/")
	nodeS, portS, ok2 := strings.Cut(tail, ".")
	node, err1 := strconv.ParseUint(nodeS, 10, 64)
	port, err2 := strconv.ParseUint(portS, 10, 32)
	if !ok || !ok2 || err1 != nil || err2 != nil {
		return krcore.Principal{}, false
	}
	return krcore.Principal{Node: node, Port: uint32(port)}, true
}

// parseLend reads an opLend's body: the borrower, the layout's generation
// and the lender's grant.
func parseLend(s string) (to krcore.Principal, gen uint32, exp string, ok bool) {
	b := []byte(s)
	var v [3]uint64
	for i := range v {
		x, k := binary.Uvarint(b)
		if k <= 0 {
			return to, 0, "", false
		}
		v[i], b = x, b[k:]
	}
	if v[1] > math.MaxUint32 || v[2] > math.MaxUint32 {
		return to, 0, "", false
	}
	return krcore.Principal{Node: v[0], Port: uint32(v[1])}, uint32(v[2]), string(b), true
}

// execLend answers an opLend from principal from: if from's grant the
// request names gives Read on an LMR still of the layout named, it grants
// Read to the borrower, lent by from (whose rights bound it and who
// withdraws it), and answers its export name.
func (n *Node) execLend(ctx context.Context, from krcore.Principal, req ctlMsg) reply {
	to, gen, exp, ok := parseLend(req.name)
	if !ok || to.Node == 0 || to.Port == 0 || req.perm != Read {
		return failure(codeInvalid, "malformed loan")
	}
	n.mu.Lock()
	g := n.grants[exp]
	n.mu.Unlock()
	if g == nil {
		return failure(codeFreed, "grant %q withdrawn", exp)
	}
	l := g.lmr
	l.op.Lock() // no grant is made or moved while the loan is
	defer l.op.Unlock()
	n.mu.Lock()
	switch {
	case n.grants[exp] != g || l.freed:
		n.mu.Unlock()
		return failure(codeFreed, "grant %q withdrawn", exp)
	case g.mapper != from || g.perm&Read == 0 || g.parent != "": // a loan is not lent on
		n.mu.Unlock()
		return failure(codePerm, "grant %q does not give node %d port %d Read", exp, from.Node, from.Port)
	case l.lay.gen != gen:
		n.mu.Unlock()
		return failure(codeFreed, "grant %q: the LMR moved", exp)
	}
	lent, lay, ids := loanName(from), l.lay, l.pieces
	n.mu.Unlock()
	ng := &grant{lmr: l, mapper: to, lender: from, parent: exp, perm: Read}
	ctx, cancel := context.WithTimeout(ctx, ctlTimeout)
	defer cancel()
	if err := n.exportAll(ctx, lay, ids, lent, *ng); err != nil {
		return failure(codeFailed, "lend: %v", err)
	}
	n.mu.Lock()
	l.live[lent] = ng
	n.grants[lent] = ng
	n.mu.Unlock()
	return reply{name: lent}
}
