package lite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// Errors of LITE's RPC and messages.
var (
	// ErrNoService: the callee has no RPC service under the id (never
	// registered, or closed before it took the call).
	ErrNoService = errors.New("lite: no RPC service under that id")
	// ErrNoEndpoint: the node has no message endpoint of that name.
	ErrNoEndpoint = errors.New("lite: no such endpoint")
	// ErrTooLarge: a request, message or reply larger than its buffer
	// (MaxRPC, or the reply buffer the caller gave).
	ErrTooLarge = errors.New("lite: message larger than its buffer")
)

// Kinds of request (a request header's kind byte).
const (
	kindCall = 0
	kindMsg  = 1
)

// Error reply codes: code(1) arg(4).
const (
	codeNoService byte = iota + 1
	codeSvcClosed
	codeReplyTooLarge
	codeNoEndpoint
	errReplyLen = 5
)

// Call is one RPC request as the service receives it (Service.Recv).
type Call struct {
	// From is the caller's node.
	From krcore.NodeID
	// Req is the request's bytes, the service's to keep.
	Req []byte
	// Limit is the largest reply the caller takes: Reply refuses a larger
	// one (ErrTooLarge) and tells the caller so.
	Limit int

	id       uint32
	ring     *ring
	port     uint32 // the caller's queue's port, where the reply goes
	slot     uint8
	gen      uint16
	ackLater bool       // a message past its endpoint's bound: not acknowledged yet (callQueue.mu)
	q        *callQueue // the queue it was pushed to (push)
	heldAt   int        // 1 + its index in q.held while a Recv holds it (q.mu)
}

// inlineCall is a Call with room for a small request beside it: one
// allocation per call instead of two (onRequest).
type inlineCall struct {
	Call
	buf [inlineReq]byte
}

// inlineReq is the largest request that shares its Call's allocation.
const inlineReq = 64

// newCall returns a Call whose Req is a copy of req.
func newCall(req []byte) *Call {
	if len(req) == 0 {
		return &Call{}
	}
	if len(req) > inlineReq {
		return &Call{Req: append([]byte(nil), req...)}
	}
	ic := &inlineCall{}
	ic.Req = ic.buf[:copy(ic.buf[:], req):len(req)]
	return &ic.Call
}

// Service receives the calls to one RPC id at this Node (RegisterRPC).
// Its methods are safe for concurrent use: several goroutines may serve it.
type Service struct {
	n  *Node
	id uint32
	q  callQueue
}

// RegisterRPC makes this Node serve RPC id: calls to it queue at the
// returned Service until Recv takes them. An id in use is ErrBusy.
func (n *Node) RegisterRPC(id uint32) (*Service, error) {
	r := n.rpcInit()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return nil, fmt.Errorf("lite: register RPC %d: %w", id, krcore.ErrClosed)
	case r.services[id] != nil:
		return nil, fmt.Errorf("lite: register RPC %d: %w", id, krcore.ErrBusy)
	}
	s := &Service{n: n, id: id, q: newCallQueue(0)}
	r.services[id] = s
	return s, nil
}

// Recv waits for the next call. With none queued it waits on the Node's
// port itself when nobody else does, taking the call off the link with no
// goroutine between (pop.go); otherwise it busy-polls a few microseconds,
// then sleeps. A closed Service or Node is krcore.ErrClosed.
func (s *Service) Recv(ctx context.Context) (*Call, error) {
	c, _, err := s.q.pop(ctx, true, s.n)
	if err != nil {
		return nil, fmt.Errorf("lite: RPC %d: recv: %w", s.id, err)
	}
	return c, nil
}

// Reply answers call with resp, WRITE_WITH_IMMed straight into the
// caller's reply slot. It returns once the WRITE is posted, without
// waiting for the caller's node to acknowledge it (the next reply on the
// same queue reaps that); a reply that never lands ends the caller's Call
// at its deadline. A resp larger than call.Limit is ErrTooLarge, and the
// caller's Call fails with it too. Each call takes one Reply.
func (s *Service) Reply(ctx context.Context, call *Call, resp []byte) error {
	if call == nil || !s.q.release(call) {
		err := fmt.Errorf("not a call this service holds: %w", krcore.ErrInvalid)
		if s.q.isClosed() {
			err = krcore.ErrClosed
		}
		return fmt.Errorf("lite: RPC %d: reply: %w", s.id, err)
	}
	var err error
	if len(resp) > call.Limit {
		err = fmt.Errorf("reply of %d bytes, the caller takes %d: %w", len(resp), call.Limit, ErrTooLarge)
		s.n.reply(ctx, call, immError, rpcErrBody(codeReplyTooLarge, len(resp)))
	} else {
		err = s.n.reply(ctx, call, immReply, resp)
	}
	if err != nil {
		return fmt.Errorf("lite: RPC %d: reply to node %d: %w", s.id, call.From, err)
	}
	return nil
}

// ReplyRecv answers call and waits for the next one, as LITE's combined
// reply-and-receive. A failed reply returns its error and no call; the
// next Recv takes the next one.
func (s *Service) ReplyRecv(ctx context.Context, call *Call, resp []byte) (*Call, error) {
	if err := s.Reply(ctx, call, resp); err != nil {
		return nil, err
	}
	return s.Recv(ctx)
}

// Close stops the service: Recv fails with krcore.ErrClosed, and every
// call it held, queued or taken and not answered, is answered with
// ErrNoService, so no caller waits for it. The id is free again.
func (s *Service) Close() error {
	r := &s.n.rpc
	r.mu.Lock()
	if r.services[s.id] == s {
		delete(r.services, s.id)
	}
	r.mu.Unlock()
	for _, c := range s.q.close() {
		s.n.replyErrAsync(c, codeSvcClosed, 0)
	}
	return nil
}

// Call calls RPC id at node with req and waits for the reply, which it
// copies into resp and whose length it returns. The request is one
// WRITE_WITH_IMM into a free slot of this node's ring at the callee (the
// first call to a node sets the ring up with one control exchange), the
// reply one WRITE_WITH_IMM into this node's reply slot. With no free slot
// Call waits for one. A reply larger than resp fails with ErrTooLarge; an
// id the callee does not serve with ErrNoService; a callee that dies
// fails the call with its WRITE's completion error or at the deadline:
// ctx's, or within Options.CallTimeout (after at least half of it) when
// ctx has none. A call that ends at its
// deadline keeps its slot until the reply comes, so that a late reply
// never lands in another call's slot; when every slot is held so, the
// next call sets up a new ring. The RPC id travels in the request's
// header in the slot: beside the slot, the call and the ring, a 32-bit id
// does not fit in the immediate.
func (n *Node) Call(ctx context.Context, node krcore.NodeID, id uint32, req, resp []byte) (int, error) {
	admitted, err := n.qos.enter(ctx, len(req)+len(resp))
	if err != nil {
		return 0, fmt.Errorf("lite: call %d at node %d: %w", id, node, err)
	}
	defer admitted.done()
	k, err := n.call(ctx, node, id, kindCall, "", req, resp)
	if err != nil {
		return 0, fmt.Errorf("lite: call %d at node %d: %w", id, node, err)
	}
	return k, nil
}

// call makes one request (a call, or a message to the endpoint name) and
// waits for its reply.
func (n *Node) call(ctx context.Context, node krcore.NodeID, id uint32, kind uint8, name string, body, resp []byte) (int, error) {
	if len(name)+len(body) > MaxRPC {
		return 0, fmt.Errorf("request of %d bytes, at most %d: %w", len(name)+len(body), MaxRPC, ErrTooLarge)
	}
	if _, ok := ctx.Deadline(); !ok {
		if ctx == context.Background() || ctx == context.TODO() {
			ctx = n.defaultBound()
		} else {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, n.callTimeout())
			defer cancel()
		}
	}
	for retried := false; ; retried = true {
		s, err := n.session(ctx, node)
		if err != nil {
			return 0, err
		}
		k, err := n.callIn(ctx, s, id, kind, name, body, resp)
		if errors.Is(err, errSessionGone) || (!retried && errors.Is(err, verbs.RemAccessErr)) {
			continue // a ring the callee withdrew (it restarted): set up again
		}
		return k, err
	}
}

// errSessionGone: the session was torn down while the call waited for a
// slot; the call goes on in a new one.
var errSessionGone = errors.New("lite: session torn down")

// callIn makes a call in session s.
func (n *Node) callIn(ctx context.Context, s *session, id uint32, kind uint8, name string, body, resp []byte) (int, error) {
	var slot uint8
	select {
	case slot = <-s.free:
	default:
		var err error
		if slot, err = n.credit(ctx, s); err != nil {
			return 0, err
		}
	}
	return n.callSlot(ctx, s, slot, id, kind, name, body, resp)
}

// errStale: every slot of a session was held by calls their callers gave
// up on, whose replies never came (abandon).
var errStale = errors.New("lite: every slot held by an abandoned call")

// credit waits for a free slot of s.
func (n *Node) credit(ctx context.Context, s *session) (uint8, error) {
	r := &n.rpc
	select {
	case slot := <-s.free:
		return slot, nil
	case <-s.dead:
		return 0, errSessionGone
	case <-r.stop:
		return 0, errClosedNode
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// callSlot makes a call in slot of session s.
func (n *Node) callSlot(ctx context.Context, s *session, slot uint8, id uint32, kind uint8, name string, body, resp []byte) (int, error) {
	limit := min(len(resp), MaxRPC)
	s.mu.Lock()
	s.gen++
	p := s.pend[slot].reset(s.gen, limit)
	s.inflight[slot] = p
	if b := s.reply.Bytes(); !s.gone && b != nil {
		clear(b[int(slot)*rpcSlotSize:][:replyTagLen]) // see replyTag
	}
	spare := s.spare
	s.spare = nil
	s.mu.Unlock()
	var hdr [rpcHdr]byte
	putHdr(hdr[:], id, limit, kind, uint8(len(name)))
	v := imm{kind: immRequest, slot: slot, epoch: s.epoch, gen: p.gen}
	to := krcore.Principal{Node: s.node, Port: n.port}
	e, err := n.postImm(ctx, spare, to, s.ring, int(slot)*rpcSlotSize, hdr[:], name, body, v)
	if err != nil {
		s.release(slot)
		return 0, err
	}
	err = n.awaitReply(ctx, s, p, e)
	n.detach(s, p, e, to, err)
	if err != nil {
		if !n.abandon(s, slot, p) {
			return s.take(slot, p, resp) // the reply came: take it
		}
		if wcFatal(err) {
			n.teardown(s, err)
		}
		return 0, err
	}
	return s.take(slot, p, resp)
}

// awaitReply waits on e, the queue that posted p's request and holds the
// port its reply comes to, for the reply, polling the request's
// completion beside it (waitReply): a WRITE that fails ends the call
// within replySlice, and a reply that comes first needs no wait for the
// WRITE's acknowledgement (e goes back to the pool owing it). A message for another call (the late
// reply of one that gave up on this queue before) frees that call's slot.
func (n *Node) awaitReply(ctx context.Context, s *session, p *pending, e *pooled) error {
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return fmt.Errorf("its session ended: %w", s.cause())
	}
	p.e = e
	s.mu.Unlock()
	for p.state.Load() == waiting {
		nc, nm, err := n.waitReply(ctx, e)
		for i := range e.msgs[:nm] {
			if !n.replyIn(s, &e.msgs[i]) {
				n.rpc.dropped.Add(1)
			}
			e.msgs[i] = krcore.Message{}
		}
		if nc > 0 {
			e.owed = false
			if err := e.out[0].Err(); err != nil {
				return err
			}
		}
		switch {
		case err == nil:
		case p.state.Load() != waiting:
			return nil
		case isDone(s.dead):
			return fmt.Errorf("its session ended: %w", s.cause())
		case isDone(n.rpc.stop):
			return errClosedNode
		case errors.Is(err, errSliceEnd):
		default:
			return err
		}
	}
	return nil
}

// waitReply waits on e for replies and, if owed, its request's
// completion. With the completion owed it waits for the replies alone
// (PopMsgsWait), so that the calling goroutine, waiting on the receive
// queue, takes its reply off the link itself rather than from krcore's
// receive-queue dispatcher (the WRITE's acknowledgement mostly comes with
// the reply, and PopAnyWait sleeps on the send queue), within a shared
// slice of at most replySlice (sliceBound): at its end (errSliceEnd) the
// caller polls the completion, so that a failed WRITE ends the call
// within replySlice; a ctx cancelled before its deadline is seen there
// too (Close wakes the wait at once: it closes the queue).
func (n *Node) waitReply(ctx context.Context, e *pooled) (nc, nm int, err error) {
	if !e.owed {
		nm, err = e.q.PopMsgsWait(ctx, e.msgs[:])
		return 0, nm, err
	}
	if nm = e.q.PopMsgs(e.msgs[:]); nm > 0 {
		return e.q.Pop(e.out[:]), nm, nil
	}
	wctx, sliced := n.sliceBound(ctx)
	nm, err = e.q.PopMsgsWait(wctx, e.msgs[:])
	nc = e.q.Pop(e.out[:])
	if err != nil && sliced && wctx.Err() != nil {
		err = errSliceEnd
		if cerr := ctx.Err(); cerr != nil {
			err = cerr // cancelled within the slice: seen at its end
		}
	}
	return nc, nm, err
}

// errSliceEnd: a wait for a reply reached its slice's end (waitReply).
var errSliceEnd = errors.New("lite: reply wait slice ended")

// replySlice bounds how late a caller waiting for its reply sees its
// WRITE's completion: its error ends the call.
const replySlice = time.Millisecond

// sliceBound is the context a caller waits for its reply within while its
// WRITE's completion is owed: one that ends within replySlice, shared by
// every such wait while at least half of it is left (a context of the
// wait's own would cost a timer each call), or ctx if that ends first;
// sliced says which.
func (n *Node) sliceBound(ctx context.Context) (_ context.Context, sliced bool) {
	r := &n.rpc
	now := time.Now()
	b := r.slice.Load()
	if b == nil || b.at.Sub(now) < replySlice/2 {
		r.boundMu.Lock()
		if b = r.slice.Load(); b == nil || b.at.Sub(now) < replySlice/2 {
			nb := &callBound{at: now.Add(replySlice)}
			nb.ctx, nb.cancel = context.WithDeadline(context.Background(), nb.at)
			if last := r.slice.Swap(nb); last != nil {
				last.cancel() // its waits see their slice end, as they would within replySlice/2
			}
			b = nb
		}
		r.boundMu.Unlock()
	}
	if dl, ok := ctx.Deadline(); ok && !dl.After(b.at) {
		return ctx, false
	}
	return b.ctx, true
}

// detach ends p's wait on e and gives e back: after a reply, as the
// session's spare queue if it has none (its next call takes it without
// the pool's lock and look-up), else to the pool; or retires it, when the
// wait failed for another reason than its context (the queue may be in
// error or closed) or the session was torn down (which closes the queues
// its calls wait on). A queue given back after its context ended goes to
// the pool and may still get the reply, which the next call on it hands
// over, or its retirement (vqPool.retire).
func (n *Node) detach(s *session, p *pending, e *pooled, to krcore.Principal, err error) {
	keep := err == nil || !ctx0(err)
	s.mu.Lock()
	p.e = nil
	gone := s.gone
	spare := err == nil && !gone && s.spare == nil
	if spare {
		s.spare = e
	}
	s.mu.Unlock()
	pool := &n.rpc.pool
	switch {
	case spare:
	case gone || !keep:
		pool.retire(e)
	default:
		pool.put(to, e)
	}
}

// ctx0 reports whether err is not a context's end.
func ctx0(err error) bool {
	return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// isDone reports whether ch is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// take copies the reply in slot into resp and frees the slot (as
// release, under the same hold of s.mu).
func (s *session) take(slot uint8, p *pending, resp []byte) (k int, err error) {
	s.mu.Lock()
	b := s.reply.Bytes()
	switch {
	case s.gone || b == nil:
		err = fmt.Errorf("its session ended: %w", s.causeLocked())
	case p.kind == immError:
		err = rpcErrOf(b[int(slot)*rpcSlotSize+replyTagLen:int(slot)*rpcSlotSize+p.n], len(resp))
	default:
		k = copy(resp, b[int(slot)*rpcSlotSize+replyTagLen:int(slot)*rpcSlotSize+p.n])
	}
	s.inflight[slot] = nil
	s.mu.Unlock()
	s.free <- slot
	return k, err
}

// release frees slot for the next call.
func (s *session) release(slot uint8) {
	s.mu.Lock()
	s.inflight[slot] = nil
	s.mu.Unlock()
	s.free <- slot
}

// abandon gives up waiting for p's reply: the slot stays taken until the
// reply comes (the callee may still write it), so no later call's reply
// can be overwritten by this one's. It reports false if the reply came
// first. When every slot is held so, the callee answers none of them and
// no call would get a slot again: the session is torn down, and calls go
// on in a new ring (replies to the abandoned calls then fail at the
// callee, whose writes the withdrawn reply area refuses).
func (n *Node) abandon(s *session, slot uint8, p *pending) bool {
	s.mu.Lock()
	ok := p.state.CompareAndSwap(waiting, abandoned)
	stale := ok && s.staleLocked()
	s.mu.Unlock()
	if stale {
		n.teardown(s, errStale)
	}
	return ok
}

// staleLocked reports whether every slot of s is held by an abandoned
// call; s.mu held.
func (s *session) staleLocked() bool {
	for _, p := range s.inflight {
		if p == nil || p.state.Load() != abandoned {
			return false
		}
	}
	return true
}

// cause is why s was torn down.
func (s *session) cause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.causeLocked()
}

func (s *session) causeLocked() error {
	if s.why == nil {
		return krcore.ErrClosed
	}
	return s.why
}

// reply WRITE_WITH_IMMs body into c's reply slot at the caller.
func (n *Node) reply(ctx context.Context, c *Call, kind uint8, body []byte) error {
	region, err := n.replyRegion(ctx, c.ring)
	if err != nil {
		return err
	}
	v := imm{kind: kind, slot: c.slot, epoch: c.ring.epoch, gen: c.gen}
	to := krcore.Principal{Node: c.ring.caller, Port: c.port}
	var tag [replyTagLen]byte
	binary.LittleEndian.PutUint64(tag[:], replyTag(c.ring.token, c.gen))
	e, err := n.postImm(ctx, nil, to, region, int(c.slot)*rpcSlotSize, tag[:], "", body, v)
	if err != nil {
		return err
	}
	pool := &n.rpc.pool
	if _, err := e.poll(); err != nil {
		pool.retire(e)
		return err
	}
	pool.put(to, e)
	return nil
}

// replyErrAsync answers c with an error on a goroutine of the Node: serve
// must not wait for a WRITE.
func (n *Node) replyErrAsync(c *Call, code byte, arg int) {
	n.goRPC(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, ctlTimeout)
		defer cancel()
		n.reply(ctx, c, immError, rpcErrBody(code, arg)) // a lost reply ends the call at its deadline
	})
}

// goRPC runs f on a goroutine Close waits for; once Close waits, f is
// dropped.
func (n *Node) goRPC(f func(context.Context)) {
	r := &n.rpc
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.draining {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f(r.ctx)
	}()
}

func rpcErrBody(code byte, arg int) []byte {
	b := make([]byte, errReplyLen)
	b[0] = code
	binary.LittleEndian.PutUint32(b[1:], uint32(arg))
	return b
}

// rpcErrOf is the error an error reply stands for.
func rpcErrOf(b []byte, limit int) error {
	if len(b) < errReplyLen {
		return fmt.Errorf("malformed error reply: %w", krcore.ErrInvalid)
	}
	arg := binary.LittleEndian.Uint32(b[1:])
	switch b[0] {
	case codeNoService:
		return fmt.Errorf("the callee does not serve it: %w", ErrNoService)
	case codeSvcClosed:
		return fmt.Errorf("the service closed before it answered: %w", ErrNoService)
	case codeReplyTooLarge:
		return fmt.Errorf("reply of %d bytes, resp holds %d: %w", arg, limit, ErrTooLarge)
	case codeNoEndpoint:
		return fmt.Errorf("the node has no such endpoint: %w", ErrNoEndpoint)
	}
	return fmt.Errorf("unknown error reply %d: %w", b[0], krcore.ErrInvalid)
}

// callTimeout bounds a call without a deadline.
func (n *Node) callTimeout() time.Duration {
	if n.opts.CallTimeout > 0 {
		return n.opts.CallTimeout
	}
	return DefaultCallTimeout
}

// callBound is a context that the calls of a caller without a deadline of
// its own share (see defaultBound).
type callBound struct {
	ctx    context.Context
	at     time.Time // ctx's deadline
	cancel context.CancelFunc
}

// defaultBound is the context of a call whose own context is
// context.Background or TODO: one whose deadline is callTimeout from its
// making and at least half of it away, shared by every such call until it
// gets closer. A context of the call's own cost each call a timer set and
// stopped and five of its nine allocations (an 8 B call in one process:
// 4-5% of its median); a call so bound ends within callTimeout, after at
// least half of it.
func (n *Node) defaultBound() context.Context {
	r := &n.rpc
	timeout := n.callTimeout()
	now := time.Now()
	if b := r.bound.Load(); b != nil && b.at.Sub(now) >= timeout/2 {
		return b.ctx
	}
	r.boundMu.Lock()
	defer r.boundMu.Unlock()
	if b := r.bound.Load(); b != nil && b.at.Sub(now) >= timeout/2 {
		return b.ctx
	}
	// The bound before the last one has expired: the last one was made
	// once it had less than half of timeout left, at least half of
	// timeout ago.
	if r.boundPrev != nil {
		r.boundPrev()
	}
	b := &callBound{at: now.Add(timeout)}
	b.ctx, b.cancel = context.WithDeadline(context.Background(), b.at)
	if last := r.bound.Swap(b); last != nil {
		r.boundPrev = last.cancel
	}
	return b.ctx
}

// stopBounds releases the shared bounds; at Close, after serve stopped.
func (n *Node) stopBounds() {
	r := &n.rpc
	r.boundMu.Lock()
	defer r.boundMu.Unlock()
	if r.boundPrev != nil {
		r.boundPrev()
	}
	for _, b := range []*callBound{r.bound.Load(), r.slice.Load()} {
		if b != nil {
			b.cancel()
		}
	}
}

// onWrite dispatches a WRITE_WITH_IMM notification to this Node's port,
// on serve: a request into a ring here. Replies go to the port of the
// caller's queue (awaitReply). Whatever does not check out is dropped and
// counted.
func (n *Node) onWrite(m *krcore.Message) {
	v := decodeImm(m.Imm)
	if !m.HasImm || m.Status != verbs.Success || v.kind != immRequest || !n.onRequest(m.From, m.Port, v, m.Len) {
		n.rpcInit().dropped.Add(1)
	}
}

// onRequest queues the request in slot v.slot of from's ring for its
// service or endpoint; its reply goes to port at from, the port of the
// queue that sent it.
func (n *Node) onRequest(from krcore.NodeID, port uint32, v imm, length int) bool {
	r := n.rpcInit()
	r.mu.Lock()
	g := r.rings[from]
	r.mu.Unlock()
	if g == nil || port == 0 || g.epoch != v.epoch || int(v.slot) >= rpcSlots || length < rpcHdr || length > rpcSlotSize {
		return false
	}
	b := g.mr.Bytes()
	if b == nil {
		return false
	}
	b = b[int(v.slot)*rpcSlotSize : int(v.slot)*rpcSlotSize+length]
	limit, kind, nameLen := int(binary.LittleEndian.Uint16(b[4:])), b[6], int(b[7])
	if limit > MaxRPC || nameLen > length-rpcHdr {
		return false
	}
	body := b[rpcHdr:]
	var c *Call
	switch kind {
	case kindCall:
		c = newCall(body)
	case kindMsg:
		c = newCall(body[nameLen:])
	default:
		return false
	}
	c.From, c.Limit, c.id, c.ring, c.port, c.slot, c.gen = from, limit, binary.LittleEndian.Uint32(b), g, port, v.slot, v.gen
	if kind == kindCall {
		n.toService(c)
	} else {
		n.toEndpoint(string(body[:nameLen]), c)
	}
	return true
}

// toService queues c at its service, or answers it with an error.
func (n *Node) toService(c *Call) {
	r := &n.rpc
	r.mu.Lock()
	s := r.services[c.id]
	r.mu.Unlock()
	if s == nil {
		n.replyErrAsync(c, codeNoService, 0)
	} else if ok, _ := n.queue(&s.q, c); !ok {
		n.replyErrAsync(c, codeSvcClosed, 0)
	}
}

// onReply takes a reply notification that came to a call's queue from
// node, the callee of the call's session: the reply of the call waiting
// in its slot (which then takes it), or the late reply of a call that gave
// up, whose slot it frees. It reports false for anything that does not
// check out, a slot without its call's tag among it (replyTag: the
// notification's port does not tell the callee from another process of
// its node).
func (n *Node) onReply(node krcore.NodeID, m *krcore.Message) bool {
	r := &n.rpc
	r.mu.Lock()
	s := r.sessions[node]
	r.mu.Unlock()
	if s == nil {
		return false
	}
	select {
	case <-s.ready:
	default:
		return false // no reply is due before the set-up ends
	}
	return n.replyIn(s, m)
}

// replyIn is onReply in session s, set up: the session of a call waiting
// on the queue m came to, which needs no look-up. A reply to a call of
// another session of the same node (an earlier one, whose call gave up on
// this queue) fails the epoch's check, as it would in the node's current
// session.
func (n *Node) replyIn(s *session, m *krcore.Message) bool {
	v := decodeImm(m.Imm)
	if !m.Write || !m.HasImm || m.Status != verbs.Success || m.From != s.node || (v.kind != immReply && v.kind != immError) {
		return false
	}
	length := m.Len
	if int(v.slot) >= rpcSlots || length < 0 || length > rpcSlotSize || s.err != nil || s.epoch != v.epoch {
		return false
	}
	s.mu.Lock()
	p := s.inflight[v.slot]
	if p == nil || p.gen != v.gen || length < replyTagLen || (v.kind == immReply && length-replyTagLen > p.limit) ||
		(v.kind == immError && length-replyTagLen < errReplyLen) || !s.taggedLocked(v.slot, p.gen) {
		s.mu.Unlock()
		return false
	}
	p.kind, p.n = v.kind, length
	switch {
	case p.state.CompareAndSwap(waiting, replied):
		s.mu.Unlock()
	case p.state.Load() == abandoned:
		s.inflight[v.slot] = nil
		s.mu.Unlock()
		s.free <- v.slot
	default: // a second reply to the same call
		s.mu.Unlock()
		return false
	}
	return true
}

// taggedLocked reports whether slot holds the tag of the call of
// generation gen (replyTag); s.mu held.
func (s *session) taggedLocked(slot uint8, gen uint16) bool {
	b := s.reply.Bytes()
	if s.gone || b == nil {
		return false
	}
	return binary.LittleEndian.Uint64(b[int(slot)*rpcSlotSize:]) == replyTag(s.token, gen)
}

// onLate takes the late reply m found in a queue being retired.
func (n *Node) onLate(m *krcore.Message) {
	if !n.onReply(m.From, m) {
		n.rpc.dropped.Add(1)
	}
}

// callQueue holds the calls of a Service or the messages of an Endpoint
// until a Recv takes them.
type callQueue struct {
	mu     sync.Mutex
	calls  []*Call
	held   []*Call // taken by Recv, not yet answered (Call.heldAt)
	closed bool
	ready  chan struct{} // a token: calls may be queued
	gone   chan struct{} // closed by close
	count  atomic.Int32  // len(calls), for spinning
	// bound, if not 0, is how many queued calls are acknowledged: one
	// pushed past it waits (ackLater) until it moves up within it.
	bound int
	// wctx is the context a popping Recv of q waits within (waitCtx),
	// a child of a context whose Done is wdone.
	wctx    context.Context
	wcancel context.CancelFunc
	wdone   <-chan struct{}
}

func newCallQueue(bound int) callQueue {
	return callQueue{ready: make(chan struct{}, 1), gone: make(chan struct{}), bound: bound}
}

// push queues c; ok is false once closed. Past the bound, c.ackLater is
// set, and ackNow false. wake is false for the call the popping Recv of q
// takes itself (Node.queue): no other Recv need wake for it.
func (q *callQueue) push(c *Call, wake bool) (ok, ackNow bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false, false
	}
	c.ackLater = q.bound > 0 && len(q.calls) >= q.bound
	c.q = q
	q.calls = append(q.calls, c)
	q.count.Add(1)
	if wake {
		q.signal()
	}
	return true, !c.ackLater
}

// signal leaves the ready token; q.mu held.
func (q *callQueue) signal() { signal(q.ready) }

// signal leaves a token in ch if it has room.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// pop waits for the next call of n's queue q; hold keeps it until
// release. moved is the call that the pop moved within the bound, to
// acknowledge now. With nothing queued it pops n's port itself when the
// role is free (popFor); one that handed a call to another Recv waits for
// a call of its own before it pops again.
func (q *callQueue) pop(ctx context.Context, hold bool, n *Node) (c, moved *Call, err error) {
	handed := false
	for {
		if c, moved, err := q.tryPop(hold); c != nil || err != nil {
			return c, moved, err
		}
		if !handed {
			switch n.popFor(ctx, q) {
			case popOwn:
				continue
			case popHanded:
				handed = true
				continue
			case popFailed:
				if err := ctx.Err(); err != nil {
					return nil, nil, err
				}
				continue
			}
		}
		if spin(func() bool { return q.count.Load() > 0 }) {
			continue
		}
		select {
		case <-q.ready:
			handed = false
		case <-q.gone:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// waitCtx is the context q's popping Recv waits within: ctx's child,
// which close cancels too. It is kept for the next Recv whose ctx has the
// same Done channel (a server's loop passes one ctx), which then
// allocates nothing.
func (q *callQueue) waitCtx(ctx context.Context) context.Context {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.wctx == nil || q.wdone != ctx.Done() || q.wctx.Err() != nil {
		if q.wcancel != nil {
			q.wcancel()
		}
		q.wctx, q.wcancel = context.WithCancel(ctx)
		q.wdone = ctx.Done()
		if q.closed {
			q.wcancel()
		}
	}
	return q.wctx
}

func (q *callQueue) tryPop(hold bool) (c, moved *Call, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, nil, krcore.ErrClosed
	}
	if len(q.calls) == 0 {
		return nil, nil, nil
	}
	c = q.calls[0]
	q.calls[0] = nil
	if len(q.calls) == 1 {
		// Emptied: keep the slot, so that the next push (a round trip's
		// every call) reuses it instead of growing a new array.
		q.calls = q.calls[:0]
	} else {
		q.calls = q.calls[1:]
	}
	q.count.Add(-1)
	if len(q.calls) > 0 {
		q.signal() // for the next Recv
	}
	if hold {
		q.held = append(q.held, c)
		c.heldAt = len(q.held)
	}
	if q.bound > 0 && len(q.calls) >= q.bound && q.calls[q.bound-1].ackLater {
		moved = q.calls[q.bound-1]
		moved.ackLater = false
	}
	return c, moved, nil
}

// release forgets a held call; false if it held no such call. c.q, set
// before c was queued, tells a call of another queue without reading what
// that queue's lock guards.
func (q *callQueue) release(c *Call) bool {
	if c.q != q {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	i := c.heldAt - 1
	if i < 0 || i >= len(q.held) || q.held[i] != c {
		return false
	}
	last := q.held[len(q.held)-1]
	q.held[i], last.heldAt = last, i+1
	q.held[len(q.held)-1] = nil
	q.held = q.held[:len(q.held)-1]
	c.heldAt = 0
	return true
}

func (q *callQueue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// close refuses further calls and returns those queued or held.
func (q *callQueue) close() []*Call {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	close(q.gone)
	if q.wcancel != nil {
		q.wcancel() // wakes a Recv popping the port for q
	}
	out := append(q.calls, q.held...)
	q.calls, q.held = nil, nil
	q.count.Store(0)
	return out
}
