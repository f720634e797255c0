package lite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// Control message kinds.
const (
	opMap byte = iota + 1
	opUnmap
	opReply
)

// Control message kinds of LMR placement (stripe.go, move.go): piece
// operations a master asks of the nodes holding its LMRs, and a mapper's
// request for an LMR's layout.
const (
	opAlloc byte = 0x30 + iota
	opGrant
	opRevoke
	opRelease
	opLayout
)

// Reply codes.
const (
	codeOK byte = iota
	codeFreed
	codePerm
	codeFailed
)

// A control message is kind(1) id(8) port(4) perm(1) code(1) name: the
// requester's id and the port it awaits replies on; name is an LMR's name
// (Map), or a grant's export name (Unmap, a Map's reply).
const hdrLen = 15

type ctlMsg struct {
	kind byte
	id   uint64
	port uint32
	perm Perm
	code byte
	name string
}

type reply struct {
	code byte
	name string
}

// waiter is a control request awaiting its reply from node.
type waiter struct {
	node krcore.NodeID
	ch   chan reply
}

func (m ctlMsg) encode(b []byte) int {
	b[0] = m.kind
	binary.LittleEndian.PutUint64(b[1:], m.id)
	binary.LittleEndian.PutUint32(b[9:], m.port)
	b[13], b[14] = byte(m.perm), m.code
	return hdrLen + copy(b[hdrLen:], m.name)
}

func decode(b []byte) (ctlMsg, bool) {
	if len(b) < hdrLen {
		return ctlMsg{}, false
	}
	return ctlMsg{kind: b[0], id: binary.LittleEndian.Uint64(b[1:]), port: binary.LittleEndian.Uint32(b[9:]),
		perm: Perm(b[13]), code: b[14], name: string(b[hdrLen:])}, true
}

// handle answers one message and posts its buffer again.
func (n *Node) handle(ctx context.Context, m *krcore.Message) {
	if m.Write {
		n.onWrite(m)
		return
	}
	data := m.Data
	if m.Buf != nil {
		data = m.Buf.MR.Bytes()[m.Buf.Off : m.Buf.Off+m.Len]
	}
	req, ok := decode(data)
	if m.Buf != nil {
		defer n.srv.PushRecv(*m.Buf) // after decode copied the name out
	}
	if !ok || m.Write || m.Status != verbs.Success {
		return
	}
	var code byte
	var name string
	// The sender's principal, as its runtime vouches: grants and pieces
	// are its alone.
	from := krcore.Principal{Node: m.From, Port: m.Port}
	switch req.kind {
	case opMap:
		n.spawn(ctx, from, req, n.grantOp)
		return
	case opUnmap:
		n.spawn(ctx, from, req, n.revokeOp)
		return
	case opLayout:
		n.spawn(ctx, from, req, n.layoutOp)
		return
	case opAlloc, opGrant, opRevoke, opRelease:
		n.spawnPieceOp(ctx, from, req)
		return
	case opRPCOpen:
		name, code = n.openRing(from, req.name)
	case opReply:
		n.deliver(m.From, req)
		return
	case opMemset, opMemcpy:
		n.spawn(ctx, from, req, n.execMem)
		return
	case opShare, opFree, opSetPerm, opLend:
		n.spawn(ctx, from, req, n.execAdmin)
		return
	case opBarrier, opBarrierLeave:
		n.barrierMsg(m.From, req)
		return
	case opDirAdd, opDirDel, opDirFind:
		r := n.dirAnswer(m.From, req.kind, req.name)
		name, code = r.name, r.code
	default:
		return
	}
	ctx, cancel := context.WithTimeout(ctx, ctlTimeout)
	defer cancel()
	// A lost reply fails the requester at its deadline; nothing to do here.
	_ = n.send(ctx, m.From, req.port, ctlMsg{kind: opReply, id: req.id, code: code, name: name})
}

// deliver hands a reply from node to the request waiting for it. Ids are
// sequential and easy to guess: a reply from any other node than the one
// asked is dropped, so no third node can answer a Map with an export name
// of its choosing.
func (n *Node) deliver(from krcore.NodeID, m ctlMsg) {
	n.mu.Lock()
	w, ok := n.pending[m.id]
	if ok && w.node == from {
		delete(n.pending, m.id)
	}
	n.mu.Unlock()
	if ok && w.node == from {
		w.ch <- reply{code: m.code, name: m.name}
	}
}

// send SENDs m to port at node through the control queue (a reply, or a
// request that needs no answer).
func (n *Node) send(ctx context.Context, node krcore.NodeID, port uint32, m ctlMsg) error {
	n.ctlMu.Lock()
	defer n.ctlMu.Unlock()
	if err := n.ctl.Connect(ctx, node, &krcore.ConnectOptions{Port: port}); err != nil {
		return err
	}
	if err := n.sendOn(ctx, n.ctl, m); err != nil {
		if n.ctl.Outstanding() > 0 {
			n.renewCtl() // a SEND still outstanding would pin the queue to node
		}
		return err
	}
	return nil
}

// sendOn SENDs m through q, connected already, and waits for it; ctlMu
// held.
func (n *Node) sendOn(ctx context.Context, q krcore.VQ, m ctlMsg) error {
	b := n.outbox.Bytes()
	if b == nil { // the runtime closed under the Node and took the buffer
		return fmt.Errorf("lite: send: %w", krcore.ErrClosed)
	}
	k := m.encode(b)
	req := krcore.Request{ID: m.id, Op: verbs.OpSend, Local: n.outbox.Range(0, k)}
	if err := q.PushOne(ctx, true, req); err != nil {
		return err
	}
	var out [1]krcore.Completion
	if _, err := q.PopWait(ctx, out[:]); err != nil {
		return err
	}
	return out[0].Err()
}

// connectBound points srv at the LITE endpoint of node; ctlMu held. A
// SEND abandoned earlier (its requester gave up) is waited for first: srv
// holds the port and is never replaced, and a request outstanding would
// pin it to its node.
func (n *Node) connectBound(ctx context.Context, node krcore.NodeID) error {
	if n.srvAt == node {
		return nil
	}
	var out [1]krcore.Completion
	for n.srv.Outstanding() > 0 {
		if _, err := n.srv.PopWait(ctx, out[:]); err != nil {
			return err
		}
	}
	n.srvAt = 0
	if err := n.srv.Connect(ctx, node, &krcore.ConnectOptions{Port: n.port}); err != nil {
		return err
	}
	n.srvAt = node
	return nil
}

// sendRequest SENDs the request m to the LITE endpoint of node from srv,
// so that node sees it from this Node's principal.
func (n *Node) sendRequest(ctx context.Context, node krcore.NodeID, m ctlMsg) error {
	n.ctlMu.Lock()
	defer n.ctlMu.Unlock()
	if err := n.connectBound(ctx, node); err != nil {
		return err
	}
	return n.sendOn(ctx, n.srv, m)
}

// region learns the region node exports under name as this Node's
// principal (this node and port, which srv holds): the only way to learn
// a grant, which its master exports to the mapper's principal alone.
func (n *Node) region(ctx context.Context, node krcore.NodeID, name string) (krcore.Region, error) {
	n.ctlMu.Lock()
	defer n.ctlMu.Unlock()
	if err := n.connectBound(ctx, node); err != nil {
		return nil, err
	}
	return n.srv.Region(ctx, name)
}

// principal is this Node's: what a master grants its Maps to.
func (n *Node) principal() krcore.Principal {
	return krcore.Principal{Node: n.api.Node(), Port: n.port}
}

// renewCtl replaces the control queue after a SEND was abandoned; ctlMu held.
func (n *Node) renewCtl() {
	n.ctl.Close()
	if n.isClosed() {
		return // Close releases what is left
	}
	if q, err := n.api.Queue(); err == nil {
		n.qmu.Lock()
		n.ctl = q
		n.qmu.Unlock()
	}
}

// request sends m to the LITE endpoint of node and waits for its reply.
func (n *Node) request(ctx context.Context, node krcore.NodeID, m ctlMsg) (reply, error) {
	if len(m.name) > slotSize-hdrLen {
		return reply{}, fmt.Errorf("name of %d bytes: %w", len(m.name), krcore.ErrInvalid)
	}
	ch := make(chan reply, 1)
	n.mu.Lock()
	if n.stopped() { // Close frees LMRs through requests: closed alone is not enough
		n.mu.Unlock()
		return reply{}, krcore.ErrClosed
	}
	n.seq++
	m.id, m.port = n.seq, n.port
	n.pending[m.id] = waiter{node: node, ch: ch}
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.pending, m.id)
		n.mu.Unlock()
	}()
	n.pop.Need() // popped at once even when a Recv that lent the role is away
	defer n.pop.Unneed()
	if err := n.sendRequest(ctx, node, m); err != nil {
		return reply{}, err
	}
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		return reply{}, ctx.Err()
	case <-n.done:
		return reply{}, krcore.ErrClosed
	}
}

// replyErr is the error a reply stands for; its name, if any, says why.
func replyErr(r reply) error {
	var err error
	switch r.code {
	case codeOK:
		return nil
	case codeInvalid:
		err = krcore.ErrInvalid
	case codeBusy:
		err = krcore.ErrBusy
	case codeFreed:
		err = ErrFreed
	case codePerm:
		err = ErrPerm
	default:
		err = errors.New("lite: the node asked failed")
	}
	if r.name != "" {
		return fmt.Errorf("%w: %s", err, r.name)
	}
	return err
}
