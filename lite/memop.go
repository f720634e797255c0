package lite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// Control op kinds of the memory operations (this file's range: 0x40-0x43).
const (
	opMemset byte = 0x40 + iota
	opMemcpy
)

// Reply codes of the operations in 0x40-0x4f.
const (
	codeInvalid byte = 0x40 + iota
	codeBusy
)

const (
	memChunk   = 64 << 10 // a holder's local copy under n.mu, or one READ
	memWindow  = 8        // READs a holder keeps in flight
	memDefault = time.Minute
	memMax     = 10 * time.Minute
)

// ops are the goroutines a Node runs for requests that take long (a memop
// moving bytes, an Admin Free waiting on the directory) and the idle
// queues their RDMA uses. Close stops and waits for them (stopOps).
type ops struct {
	ctx  context.Context // serve's: Close cancels it
	wg   sync.WaitGroup
	mu   sync.Mutex
	idle []krcore.VQ
}

// memArgs are a Memset's or Memcpy's arguments as they travel to the
// holder: dst is the caller's grant (an export name), src the caller's
// grant on a piece held there too, or a loan to the holder on a piece held
// at srcNode (lend), empty for Memset. The holder acts only through those
// grants.
type memArgs struct {
	dstOff, srcOff, n uint64
	srcNode           krcore.NodeID
	budget            time.Duration // what is left of the caller's deadline
	value             byte
	dst, src          string
}

func (a memArgs) encode() []byte {
	b := make([]byte, 0, slotSize)
	for _, v := range []uint64{a.dstOff, a.srcOff, a.n, a.srcNode, uint64(a.budget / time.Millisecond)} {
		b = binary.AppendUvarint(b, v)
	}
	b = append(b, a.value, byte(len(a.dst)))
	return append(append(b, a.dst...), a.src...)
}

func decodeMem(s string) (memArgs, bool) {
	b := []byte(s)
	var v [5]uint64
	for i := range v {
		x, k := binary.Uvarint(b)
		if k <= 0 {
			return memArgs{}, false
		}
		v[i], b = x, b[k:]
	}
	if len(b) < 2 || int(b[1]) > len(b)-2 {
		return memArgs{}, false
	}
	k := int(b[1])
	return memArgs{dstOff: v[0], srcOff: v[1], n: v[2], srcNode: v[3],
		budget: time.Duration(min(v[4], uint64(memMax/time.Millisecond))) * time.Millisecond,
		value:  b[0], dst: string(b[2 : 2+k]), src: string(b[2+k:])}, true
}

// Memset sets n bytes at offset off of h's LMR to v. The node holding the
// bytes does it, through h's grant (which needs Write), and answers once
// they are set: no data travels.
func (n *Node) Memset(ctx context.Context, h Handle, off, size int, v byte) error {
	err := n.access(ctx, h, off, size, func(m *mapping) error {
		for _, e := range m.lay.extents(off, size, math.MaxInt) {
			a := memArgs{dstOff: e.remote, n: uint64(e.n), value: v, dst: m.regions[e.node].Name()}
			if err := n.memop(ctx, opMemset, m.lay.nodes[e.node], a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lite: memset: %w", err)
	}
	return nil
}

// Memcpy copies n bytes at srcOff of src's LMR to dstOff of dst's LMR. The
// node holding dst's bytes does it, through the caller's grants (Write on
// dst, Read on src): when src lives on another node, src's master lends
// that node Read on src (a grant exported to the holder's Node alone,
// which uses it only for this Node's copies, and withdrawn with src's
// grant at Unmap), and the holder READs src through it straight into
// dst's memory; no data travels through the caller. It returns once the
// bytes are in place. Overlapping ranges of one LMR are copied as Memmove
// copies them.
func (n *Node) Memcpy(ctx context.Context, dst Handle, dstOff int, src Handle, srcOff, size int) error {
	err := n.access(ctx, dst, dstOff, size, func(d *mapping) error {
		return n.access(ctx, src, srcOff, size, func(s *mapping) error {
			pieces := copyPieces(d, dstOff, s, srcOff, size)
			if d.master == s.master && d.name == s.name && dstOff > srcOff {
				slices.Reverse(pieces) // memmove: higher offsets first
			}
			used, err := n.lendSrc(ctx, s, pieces)
			for _, a := range pieces {
				if err != nil {
					break
				}
				err = n.memop(ctx, opMemcpy, a.holder, a.memArgs)
			}
			if err != nil { // a loan withdrawn meanwhile is lent again when redone
				n.unlend(ctx, s.master, used)
			}
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("lite: memcpy: %w", err)
	}
	return nil
}

// Memmove copies n bytes at srcOff of h's LMR to dstOff of it, the ranges
// possibly overlapping, at the node holding the bytes (h needs Read and
// Write). Overlapping ranges held by one node move in one step; on a
// striped LMR, overlapping ranges that span stripes on different nodes move
// a piece at a time, and a Move in between may leave a mix.
func (n *Node) Memmove(ctx context.Context, h Handle, dstOff, srcOff, size int) error {
	return n.Memcpy(ctx, h, dstOff, h, srcOff, size)
}

// piece is the part of a copy that one node does: dst lies whole in one
// piece of memory there, src in one at srcNode.
type piece struct {
	holder krcore.NodeID
	memArgs
}

// copyPieces cuts a copy at the stripe boundaries of both layouts.
func copyPieces(d *mapping, dstOff int, s *mapping, srcOff, size int) []piece {
	var out []piece
	for at := 0; at < size; {
		dn, dAt, dLeft := d.lay.locate(dstOff + at)
		sn, sAt, sLeft := s.lay.locate(srcOff + at)
		k := min(size-at, dLeft, sLeft)
		out = append(out, piece{holder: d.lay.nodes[dn], memArgs: memArgs{dstOff: uint64(dAt), srcOff: uint64(sAt), n: uint64(k),
			srcNode: s.lay.nodes[sn], dst: d.regions[dn].Name(), src: s.regions[sn].Name()}})
		at += k
	}
	return out
}

// loan names a loan of Read on the LMR of grant (mapped here from
// master) to the Node at holder.
type loan struct {
	master krcore.NodeID
	grant  string
	holder krcore.NodeID
}

// lendSrc names, as the src of each piece whose src lies on another node
// than its holder, a loan of src's grant to the holder: the one this Node
// has, else one src's master lends now. It returns the loans it used.
func (n *Node) lendSrc(ctx context.Context, s *mapping, pieces []piece) ([]loan, error) {
	var used []loan
	for i := range pieces {
		a := &pieces[i]
		if a.srcNode == a.holder {
			continue // the holder copies locally, through the caller's grant
		}
		k := loan{master: s.master, grant: s.export, holder: a.holder}
		n.mu.Lock()
		exp, ok := n.loans[k]
		n.mu.Unlock()
		if !ok {
			var err error
			if exp, err = n.lend(ctx, s, krcore.Principal{Node: a.holder, Port: n.port}); err != nil {
				return used, err
			}
			n.mu.Lock()
			n.loans[k] = exp
			n.mu.Unlock()
		}
		if !slices.Contains(used, k) {
			used = append(used, k)
		}
		a.src = exportName(exp, s.lay.gen)
	}
	return used, nil
}

// forgetLoans forgets the loans of grant, mapped from master; n.mu held.
func (n *Node) forgetLoans(master krcore.NodeID, grant string) {
	maps.DeleteFunc(n.loans, func(k loan, _ string) bool { return k.master == master && k.grant == grant })
}

// unlend forgets the loans used by a copy that failed (one may have been
// withdrawn) and withdraws them at master, even once ctx ended.
func (n *Node) unlend(ctx context.Context, master krcore.NodeID, used []loan) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ctlTimeout)
	defer cancel()
	for _, k := range used {
		n.mu.Lock()
		exp, ok := n.loans[k]
		delete(n.loans, k)
		n.mu.Unlock()
		if ok { // a loan not withdrawn (the master gone) dies with the LMR
			_, _ = n.request(ctx, master, ctlMsg{kind: opUnmap, name: exp})
		}
	}
}

// memop asks holder to carry out a Memset or Memcpy and waits for it.
func (n *Node) memop(ctx context.Context, kind byte, holder krcore.NodeID, a memArgs) error {
	what := "memcpy"
	if kind == opMemset {
		what = "memset"
	}
	if a.n == 0 {
		return nil
	}
	a.budget = memDefault
	if dl, ok := ctx.Deadline(); ok {
		a.budget = time.Until(dl)
	}
	r, err := n.request(ctx, holder, ctlMsg{kind: kind, name: string(a.encode())})
	if err == nil {
		err = replyErr(r)
	}
	if err != nil {
		return fmt.Errorf("lite: %s of %d bytes at node %d: %w", what, a.n, holder, err)
	}
	return nil
}

// failure is a reply saying why, cut to fit a control message.
func failure(code byte, format string, args ...any) reply {
	s := fmt.Sprintf(format, args...)
	return reply{code: code, name: s[:min(len(s), slotSize-hdrLen)]}
}

// spawn runs do for a request from principal from in a goroutine the Node
// owns (serve must not wait for it) and sends its reply.
func (n *Node) spawn(ctx context.Context, from krcore.Principal, req ctlMsg, do func(context.Context, krcore.Principal, ctlMsg) reply) {
	n.ops.wg.Add(1)
	go func() {
		defer n.ops.wg.Done()
		r := do(ctx, from, req)
		sctx, cancel := context.WithTimeout(ctx, ctlTimeout)
		defer cancel()
		// A lost reply fails the requester at its deadline.
		_ = n.send(sctx, from.Node, req.port, ctlMsg{kind: opReply, id: req.id, code: r.code, name: r.name})
	}()
}

// stopOps waits for the goroutines spawn started (Close cancelled their
// context) and closes the idle queues.
func (n *Node) stopOps() {
	n.ops.wg.Wait()
	n.ops.mu.Lock()
	defer n.ops.mu.Unlock()
	for _, q := range n.ops.idle {
		q.Close()
	}
	n.ops.idle = nil
}

// execMem carries out a Memset or Memcpy for from at this node, the holder
// of dst's bytes.
func (n *Node) execMem(ctx context.Context, from krcore.Principal, req ctlMsg) reply {
	a, ok := decodeMem(req.name)
	if !ok || a.dst == "" || (req.kind == opMemcpy) == (a.src == "") {
		return failure(codeInvalid, "malformed request")
	}
	ctx, cancel := context.WithTimeout(ctx, a.budget)
	defer cancel()
	switch {
	case req.kind == opMemset, a.srcNode == n.api.Node():
		return n.localMem(ctx, from, a)
	}
	return n.remoteCopy(ctx, from, a)
}

// through is the memory [off, off+size) of the piece held here that
// from's grant exported as exp gives access to, if that grant is from's,
// allows need and covers the range; n.mu held, which keeps Free, Unmap and
// Move from withdrawing the grant while the caller uses it.
func (n *Node) through(from krcore.Principal, exp string, need Perm, off, size uint64) (*holding, []byte, reply) {
	e := n.exports[exp]
	if e == nil {
		return nil, nil, failure(codeFreed, "grant %q withdrawn", exp)
	}
	if e.mapper != from || e.perm&need != need {
		return nil, nil, failure(codePerm, "grant %q does not give node %d port %d %b", exp, from.Node, from.Port, need)
	}
	b := e.piece.mr.Bytes()
	if b == nil {
		return nil, nil, failure(codeFreed, "grant %q: memory released", exp)
	}
	if off > uint64(len(b)) || size > uint64(len(b))-off {
		return nil, nil, failure(codeInvalid, "%d bytes at %d of %d", size, off, len(b))
	}
	return e.piece, b[off : off+size], reply{}
}

// localMem sets or copies bytes held here, a chunk at a time, each chunk
// under n.mu and checked against the grants again, so that a Free, Unmap
// or Move meanwhile stops the operation before it touches released memory.
// Such an operation is redone whole on a moved LMR (access), which is
// harmless for a Memset or a copy whose source it does not change; a copy
// between overlapping ranges of one piece is therefore done in one step
// under n.mu (copy moves as memmove does): a Move finds it not begun or
// done.
func (n *Node) localMem(ctx context.Context, from krcore.Principal, a memArgs) reply {
	if a.src != "" && a.dstOff < a.srcOff+a.n && a.srcOff < a.dstOff+a.n && n.samePiece(a.dst, a.src) {
		return n.moveChunk(from, a, 0, a.n)
	}
	for done := uint64(0); done < a.n; {
		if err := ctx.Err(); err != nil {
			return failure(codeFailed, "after %d of %d bytes: %v", done, a.n, err)
		}
		k := min(a.n-done, memChunk)
		if r := n.moveChunk(from, a, done, k); r.code != codeOK {
			return r
		}
		done += k
	}
	return reply{}
}

// samePiece reports whether two grants held here are on one piece of
// memory.
func (n *Node) samePiece(a, b string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	ga, gb := n.exports[a], n.exports[b]
	return ga != nil && gb != nil && ga.piece == gb.piece
}

// moveChunk sets or copies k bytes at offset at of the operation.
func (n *Node) moveChunk(from krcore.Principal, a memArgs, at, k uint64) reply {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, d, r := n.through(from, a.dst, Write, a.dstOff+at, k)
	if r.code != codeOK {
		return r
	}
	if a.src == "" {
		fill(d, a.value)
		return reply{}
	}
	_, s, r := n.through(from, a.src, Read, a.srcOff+at, k)
	if r.code == codeOK {
		copy(d, s)
	}
	return r
}

// fill sets every byte of b to v.
func fill(b []byte, v byte) {
	if len(b) == 0 {
		return
	}
	b[0] = v
	for i := 1; i < len(b); i *= 2 {
		copy(b[i:], b[:i])
	}
}

// remoteCopy READs src, held by another node, through the caller's grant
// there straight into dst's memory here, memWindow READs of memChunk bytes
// in flight. The src node's responder checks the grant, as for any READ.
func (n *Node) remoteCopy(ctx context.Context, from krcore.Principal, a memArgs) reply {
	if lender, ok := lenderOf(a.src); !ok || lender != from {
		// Only a loan from the caller: not this Node's own grants, nor
		// another's loans, whatever names the caller learned.
		return failure(codePerm, "src %q is no loan of node %d port %d", a.src, from.Node, from.Port)
	}
	region, err := n.region(ctx, a.srcNode, a.src)
	if err != nil {
		if errors.Is(err, krcore.ErrNoRegion) {
			return failure(codeFreed, "src grant at node %d withdrawn", a.srcNode)
		}
		return failure(codeFailed, "src at node %d: %v", a.srcNode, err)
	}
	defer krcore.Forget(region) // looked up for this copy alone
	if a.srcOff > region.Len() || a.n > region.Len()-a.srcOff {
		return failure(codeInvalid, "%d bytes at %d of src's %d", a.n, a.srcOff, region.Len())
	}
	q, err := n.takeQueue(ctx, a.srcNode)
	if err != nil {
		return failure(codeFailed, "queue to node %d: %v", a.srcNode, err)
	}
	r := n.readInto(ctx, q, from, a, region)
	if q.Outstanding() == 0 {
		n.putQueue(q)
	} else {
		q.Close() // READs still in flight must not pin a pooled queue
	}
	return r
}

// readInto pushes the READs of a remote copy and waits for them all.
func (n *Node) readInto(ctx context.Context, q krcore.VQ, from krcore.Principal, a memArgs, region krcore.Region) reply {
	var wc [memWindow]krcore.Completion
	for pushed := uint64(0); pushed < a.n || q.Outstanding() > 0; {
		if pushed < a.n && q.Outstanding() < memWindow {
			k := min(a.n-pushed, memChunk)
			n.mu.Lock()
			p, _, r := n.through(from, a.dst, Write, a.dstOff+pushed, k)
			var local krcore.Local
			if r.code == codeOK {
				local = p.mr.Range(int(a.dstOff+pushed), int(k))
			}
			n.mu.Unlock()
			if r.code != codeOK {
				return r
			}
			req := krcore.Request{ID: pushed, Op: verbs.OpRead, Local: local, Remote: region.At(a.srcOff + pushed)}
			if err := q.PushOne(ctx, true, req); err != nil {
				return failure(codeFailed, "READ of src at node %d: %v", a.srcNode, err)
			}
			pushed += k
			continue
		}
		k, err := q.PopWait(ctx, wc[:])
		if err != nil {
			return failure(codeFailed, "READ of src at node %d: %v", a.srcNode, err)
		}
		for i := range wc[:k] {
			if err := wc[i].Err(); errors.Is(err, verbs.RemAccessErr) {
				return failure(codePerm, "node %d refused the READ of src: %v", a.srcNode, err)
			} else if err != nil {
				return failure(codeFailed, "READ of src at node %d: %v", a.srcNode, err)
			}
		}
	}
	return reply{}
}

// takeQueue is an idle queue, or a new one, connected to node.
func (n *Node) takeQueue(ctx context.Context, node krcore.NodeID) (krcore.VQ, error) {
	n.ops.mu.Lock()
	var q krcore.VQ
	if k := len(n.ops.idle); k > 0 {
		q, n.ops.idle = n.ops.idle[k-1], n.ops.idle[:k-1]
	}
	n.ops.mu.Unlock()
	if q == nil {
		var err error
		if q, err = n.api.Queue(); err != nil {
			return nil, err
		}
	}
	if err := q.Connect(ctx, node, nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// putQueue keeps q for the next remote copy.
func (n *Node) putQueue(q krcore.VQ) {
	n.ops.mu.Lock()
	defer n.ops.mu.Unlock()
	n.ops.idle = append(n.ops.idle, q)
}
