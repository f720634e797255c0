package lite

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/nonce"
	"github.com/krcore/krcore/verbs"
)

// The geometry of an RPC ring, the same at every node: a callee keeps one
// ring of rpcSlots slots per caller node, and the caller a reply area of the
// same shape per callee node, reply slot i answering ring slot i.
const (
	rpcSlots    = 32   // credits of one caller node at one callee (<= 64: 6 bits of the immediate)
	rpcSlotSize = 4096 // one slot: a request's header and body, or a reply
	rpcHdr      = 8    // a request's header: id(4) limit(2) kind(1) name length(1)
	// MaxRPC is the largest request body (RPC or message, a message's
	// endpoint name included) and the largest reply (after its tag,
	// replyTagLen bytes, no larger than a request's header).
	MaxRPC = rpcSlotSize - rpcHdr
	// DefaultCallTimeout bounds a Call or Send whose context has no
	// deadline, when Options.CallTimeout is 0.
	DefaultCallTimeout = 5 * time.Second
	// rpcSpins is how often an RPC waiter polls before it sleeps: a few
	// microseconds at most.
	rpcSpins = 8
)

// replyTagLen is the length of a reply's tag, the first bytes of its
// slot (replyTag).
const replyTagLen = 8

// replyTag is the tag a reply to the call of generation gen carries in
// front of its body. token is the session's (newReplyToken), known to the
// caller and the callee alone; the generation makes a tag good for one
// call. A reply notification does not say what its WRITE wrote, and a
// callee answers from queues that hold no port, so the port a notification
// comes from cannot tell the callee from another process of its node
// (which may WRITE_WITH_IMM any region of the caller's node open to it and
// notify the caller's reply port with a guessed immediate): the caller
// clears the tag before each call and takes a reply only once its slot
// holds the tag of its call. The top bit is set: a cleared tag never
// matches.
func replyTag(token uint64, gen uint16) uint64 { return token ^ uint64(gen) | 1<<63 }

// newReplyToken is a fresh session's reply token: random, and sent to the
// callee's port alone (opRPCOpen), so only the caller and the callee know
// it. It is not derived from the reply area's export name: names are not
// secret (krcored's status lists every client's exports to any client).
func newReplyToken() uint64 { return nonce.Uint64() }

// openBody is opRPCOpen's name field: the session's reply token (8 bytes)
// and then its reply area's export name; parseOpen reads it back (ok false
// if it holds no name).
func openBody(token uint64, replyAs string) string {
	return string(binary.LittleEndian.AppendUint64(nil, token)) + replyAs
}

func parseOpen(body string) (token uint64, replyAs string, ok bool) {
	if len(body) <= 8 {
		return 0, "", false
	}
	return binary.LittleEndian.Uint64([]byte(body[:8])), body[8:], true
}

// opRPCOpen (caller to callee, through request): make a ring for me; the
// name is openBody: my reply token and my reply area's export name. The
// reply's name is the ring's epoch (1 byte) and export name.
const opRPCOpen byte = 0x10

// The immediate of an RPC WRITE_WITH_IMM: kind(2) slot(6) epoch(8) gen(16).
// The epoch names the ring (a callee makes a new one each time a caller
// node sets up again), the generation the call that holds the slot.
const (
	immRequest = 1
	immReply   = 2
	immError   = 3
)

type imm struct {
	kind, slot, epoch uint8
	gen               uint16
}

func (m imm) encode() uint32 {
	return uint32(m.kind)<<30 | uint32(m.slot&63)<<24 | uint32(m.epoch)<<16 | uint32(m.gen)
}

func decodeImm(v uint32) imm {
	return imm{kind: uint8(v >> 30), slot: uint8(v>>24) & 63, epoch: uint8(v >> 16), gen: uint16(v)}
}

// rpcState is a Node's RPC machinery, caller and callee sides.
type rpcState struct {
	inited    atomic.Bool // the maps and the pool below are made (rpcInit)
	mu        sync.Mutex
	closed    bool
	epoch     uint8
	sessions  map[krcore.NodeID]*session // callee node -> my calls to it
	rings     map[krcore.NodeID]*ring    // caller node -> its ring here
	services  map[uint32]*Service
	endpoints map[string]*Endpoint

	pool    vqPool
	dropped atomic.Uint64 // notifications refused by validation

	// bound is the context calls without a deadline share, boundPrev
	// the cancel of the one before it (defaultBound); boundMu guards
	// their renewal.
	bound     atomic.Pointer[callBound]
	slice     atomic.Pointer[callBound] // sliceBound's
	boundMu   sync.Mutex
	boundPrev context.CancelFunc
	stop      chan struct{} // closed when Close begins: waiting calls fail

	// draining: Close waits for wg; no goroutine joins it after.
	draining bool

	// wg tracks the goroutines that send replies on serve's behalf
	// (errors, message acknowledgements); ctx ends them at Close.
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

// rpcInit returns the Node's RPC state, made on first use.
func (n *Node) rpcInit() *rpcState {
	r := &n.rpc
	if r.inited.Load() { // every call and request asks: no lock once made
		return r
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sessions == nil {
		r.sessions, r.rings = map[krcore.NodeID]*session{}, map[krcore.NodeID]*ring{}
		r.services, r.endpoints = map[uint32]*Service{}, map[string]*Endpoint{}
		r.ctx, r.cancel = context.WithCancel(context.Background())
		r.stop = make(chan struct{})
		r.pool.api, r.pool.port = n.api, n.port
		r.pool.late = n.onLate
		r.inited.Store(true)
	}
	return r
}

// session is this node's calls to one callee: the callee's ring (a region
// it exported to us with remote write only), the reply area we exported to
// it, and the credits: one free slot index per call we may start.
type session struct {
	node  krcore.NodeID
	ready chan struct{} // closed once set up (err says how)
	err   error
	dead  chan struct{} // closed when torn down
	once  sync.Once

	epoch   uint8
	ring    krcore.Region
	reply   krcore.MR
	replyAs string // export name of reply
	token   uint64 // newReplyToken, see replyTag
	free    chan uint8

	mu       sync.Mutex // gen, inflight, gone, why; reply's memory while read
	gen      uint16
	inflight [rpcSlots]*pending
	gone     bool    // reply deregistered
	why      error   // the teardown's cause
	spare    *pooled // the queue the last call gave back, for the next (detach)
	// pend holds each slot's pending, reused by the slot's next call: a
	// pending is referred to only while its call holds the slot.
	pend [rpcSlots]pending
}

// pending is a call holding a slot.
type pending struct {
	gen   uint16
	state atomic.Int32 // waiting, replied, abandoned
	// e is the queue the call waits on for its reply while it waits
	// (session.mu): teardown closes it to wake the call.
	e     *pooled
	limit int   // the largest reply the call takes
	kind  uint8 // immReply or immError, once replied (session.mu)
	n     int   // the reply's length (session.mu)
}

const (
	waiting int32 = iota
	replied
	abandoned
)

// reset makes p a waiting call's, of generation gen taking replies of up
// to limit bytes, and returns it; s.mu held, the slot taken.
func (p *pending) reset(gen uint16, limit int) *pending {
	p.gen, p.limit, p.e, p.kind, p.n = gen, limit, nil, 0, 0
	p.state.Store(waiting)
	return p
}

// ring is a caller node's request ring at this callee.
type ring struct {
	caller  krcore.NodeID
	epoch   uint8
	mr      krcore.MR
	export  string
	replyAs string // the caller's reply area
	token   uint64 // the caller session's, see replyTag

	mu    sync.Mutex // reply
	reply krcore.Region
}

// freshName is an export name no other node can guess.
func freshName(kind string, peer krcore.NodeID) string {
	var b [12]byte
	rand.Read(b[:])
	return fmt.Sprintf("lite/%s/%d/%s", kind, peer, hex.EncodeToString(b[:]))
}

// session returns the live session to node, setting one up if there is
// none: one control exchange with the callee (opRPCOpen).
func (n *Node) session(ctx context.Context, node krcore.NodeID) (*session, error) {
	r := n.rpcInit()
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return nil, krcore.ErrClosed
		}
		s := r.sessions[node]
		if s == nil {
			s = &session{node: node, ready: make(chan struct{}), dead: make(chan struct{})}
			r.sessions[node] = s
			r.mu.Unlock()
			s.err = n.setupSession(ctx, s)
			close(s.ready)
			if s.err != nil {
				n.teardown(s, s.err)
				return nil, s.err
			}
			return s, nil
		}
		r.mu.Unlock()
		select {
		case <-s.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if s.err == nil {
			return s, nil
		}
		// A set-up that failed for another caller: try again, unless ours
		// is done too.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		select {
		case <-s.dead: // removed from the map: retry
		default:
			return nil, s.err
		}
	}
}

// setupSession exports a reply area to node's LITE endpoint alone and
// asks it for a ring, which it exports to this Node alone.
func (n *Node) setupSession(ctx context.Context, s *session) error {
	var err error
	if s.reply, err = n.api.RegMR(rpcSlots*rpcSlotSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return err
	}
	s.replyAs = freshName("reply", s.node)
	s.token = newReplyToken()
	callee := krcore.Principal{Node: s.node, Port: n.port}
	if err = n.api.Export(s.replyAs, s.reply, 0, s.reply.Len(), verbs.AccessRemoteWrite, callee); err != nil {
		s.replyAs = ""
		return err
	}
	rep, err := n.request(ctx, s.node, ctlMsg{kind: opRPCOpen, name: openBody(s.token, s.replyAs)})
	if err == nil && rep.code != codeOK {
		err = fmt.Errorf("the callee refused a ring: %w", replyErr(rep))
	}
	if err == nil && len(rep.name) < 2 {
		err = fmt.Errorf("the callee's ring reply is malformed: %w", krcore.ErrInvalid)
	}
	if err != nil {
		return err
	}
	s.epoch = rep.name[0]
	if s.ring, err = n.region(ctx, s.node, rep.name[1:]); err != nil {
		return err
	}
	if s.ring.Len() < rpcSlots*rpcSlotSize {
		return fmt.Errorf("the callee's ring has %d bytes: %w", s.ring.Len(), krcore.ErrInvalid)
	}
	s.free = make(chan uint8, rpcSlots)
	for i := range rpcSlots {
		s.free <- uint8(i)
	}
	return nil
}

// teardown retires s: later calls to its node set up again, calls waiting
// in it fail with cause, and its reply area is withdrawn.
func (n *Node) teardown(s *session, cause error) {
	var spare *pooled
	defer func() {
		if spare != nil {
			n.rpc.pool.retire(spare) // after s.mu: its late replies look sessions up
		}
	}()
	s.once.Do(func() {
		r := &n.rpc
		r.mu.Lock()
		if r.sessions[s.node] == s {
			delete(r.sessions, s.node)
		}
		r.mu.Unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.why, s.gone = cause, true
		spare, s.spare = s.spare, nil
		close(s.dead)
		for _, p := range s.inflight {
			if p != nil && p.e != nil {
				p.e.q.Close() // wakes the call's wait; it retires the queue (detach)
			}
		}
		if s.replyAs != "" {
			n.api.Unexport(s.replyAs)
		}
		if s.reply != nil {
			n.api.Deregister(s.reply) // under s.mu: no take reads it meanwhile
		}
		if s.ring != nil {
			krcore.Forget(s.ring) // the callee's ring, as krcored keeps it
		}
	})
}

// openRing answers opRPCOpen from the principal from: a new ring for its
// node, exported to it alone with remote write only under a fresh name,
// replacing the one the node had. The reply's name is the ring's epoch and
// export name.
func (n *Node) openRing(from krcore.Principal, body string) (string, byte) {
	caller := from.Node
	r := n.rpcInit()
	token, replyAs, ok := parseOpen(body)
	if !ok {
		return "", codeFailed
	}
	mr, err := n.api.RegMR(rpcSlots*rpcSlotSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return "", codeFailed
	}
	g := &ring{caller: caller, mr: mr, export: freshName("ring", caller), replyAs: replyAs, token: token}
	if err := n.api.Export(g.export, mr, 0, mr.Len(), verbs.AccessRemoteWrite, from); err != nil {
		n.api.Deregister(mr)
		return "", codeFailed
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		n.dropRing(g)
		return "", codeFailed
	}
	r.epoch++
	g.epoch = r.epoch
	old := r.rings[caller]
	r.rings[caller] = g
	r.mu.Unlock()
	if old != nil {
		n.dropRing(old)
	}
	return string([]byte{g.epoch}) + g.export, codeOK
}

// dropRing withdraws a ring and releases its memory.
func (n *Node) dropRing(g *ring) {
	n.api.Unexport(g.export)
	n.api.Deregister(g.mr)
	g.mu.Lock()
	if g.reply != nil {
		krcore.Forget(g.reply) // the caller's reply area, as krcored keeps it
	}
	g.mu.Unlock()
}

// replyRegion is the caller's reply area, learned on the first reply.
func (n *Node) replyRegion(ctx context.Context, g *ring) (krcore.Region, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reply == nil {
		reg, err := n.region(ctx, g.caller, g.replyAs)
		if err != nil {
			return nil, err
		}
		if reg.Len() < rpcSlots*rpcSlotSize {
			return nil, fmt.Errorf("the caller's reply area has %d bytes: %w", reg.Len(), krcore.ErrInvalid)
		}
		g.reply = reg
	}
	return g.reply, nil
}

// vqPool keeps idle queues, each with a staging buffer, connected to a
// port of one node: a WRITE_WITH_IMM takes one, so that concurrent calls
// and replies never share a queue. A queue to a node's LITE port (a
// caller's) holds a port of its own, where the replies to its calls
// come: the callee answers the port the request's notification names,
// which the caller's runtime vouches for, so the caller waits for its
// WRITE's completion and its reply on that one queue (waitReply).
type vqPool struct {
	api  krcore.API
	port uint32
	// late takes a reply left in the inbox of a queue being retired (see
	// retire).
	late func(*krcore.Message)

	mu     sync.Mutex
	closed bool
	idle   map[krcore.Principal][]*pooled
	nidle  int // queues in idle
	all    map[*pooled]bool
}

// maxIdle bounds the idle queues of a pool: a callee keeps one per caller
// queue it answered, and a caller's queue retired in error never comes
// back.
const maxIdle = 4 * rpcSlots

type pooled struct {
	q   krcore.VQ
	buf krcore.MR
	// req and out are postImm's request and completion, msgs the replies
	// a call waits for, held by whoever took the queue: fields, so that
	// the VQ calls allocate nothing.
	req  [1]krcore.Request
	out  [1]krcore.Completion
	msgs [4]krcore.Message
	// owed: the request posted last has not been popped (postImm, reap).
	owed bool
	// replies: q holds a port of its own, where replies come.
	replies bool
}

// get returns a queue connected to port to.Port at to.Node, with no
// completion owed: the idle queue used last (its completion likelier in),
// or a new one.
func (p *vqPool) get(ctx context.Context, to krcore.Principal) (*pooled, error) {
	for {
		e, err := p.idle1(to)
		switch {
		case err != nil:
			return nil, err
		case e == nil:
			return p.dial(ctx, to)
		case !e.owed:
			return e, nil
		}
		if err := p.reap(ctx, e); err == nil {
			return e, nil
		} else if ctx.Err() != nil {
			return nil, err
		}
	}
}

// idle1 takes the idle queue to to put last, if any.
func (p *vqPool) idle1(to krcore.Principal) (*pooled, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, krcore.ErrClosed
	}
	l := p.idle[to]
	if len(l) == 0 {
		return nil, nil
	}
	e := l[len(l)-1]
	p.idle[to] = l[:len(l)-1]
	p.nidle--
	return e, nil
}

// dial makes a queue connected to to; one to a LITE endpoint binds a
// port of its own for the replies (bindReplies).
func (p *vqPool) dial(ctx context.Context, to krcore.Principal) (*pooled, error) {
	q, err := p.api.Queue()
	if err != nil {
		return nil, err
	}
	e := &pooled{q: q}
	if e.buf, err = p.api.RegMR(rpcSlotSize, verbs.AccessLocalWrite); err == nil && to.Port == p.port {
		err = bindReplies(q)
		e.replies = err == nil
	}
	if err == nil {
		err = q.Connect(ctx, to.Node, &krcore.ConnectOptions{Port: to.Port})
	}
	p.mu.Lock()
	if err == nil && p.closed {
		err = krcore.ErrClosed
	}
	if err == nil {
		if p.all == nil {
			p.all, p.idle = map[*pooled]bool{}, map[krcore.Principal][]*pooled{}
		}
		p.all[e] = true
	}
	p.mu.Unlock()
	if err != nil {
		p.retire(e)
		return nil, err
	}
	return e, nil
}

// bindReplies binds q to a free port of the range LITE's callers take
// theirs from (the top bit is reserved; the LITE port is below it).
func bindReplies(q krcore.VQ) error {
	var err error
	for range 16 {
		if err = q.Bind(1<<30 | mrand.Uint32N(1<<30)); !errors.Is(err, krcore.ErrPortInUse) {
			return err
		}
	}
	return err
}

// put gives back a queue with nothing outstanding but, if owed, its last
// request (get reaps it).
func (p *vqPool) put(to krcore.Principal, e *pooled) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.retire(e)
		return
	}
	var out *pooled
	if p.nidle >= maxIdle {
		out = p.evictLocked()
	}
	p.idle[to] = append(p.idle[to], e)
	p.nidle++
	p.mu.Unlock()
	if out != nil {
		p.retire(out)
	}
}

// evictLocked takes the oldest idle queue of some principal out of the
// pool, for the caller to retire: a full pool makes room for the queue in
// use now rather than refusing it, else queues to callers long gone (a
// callee keeps one per caller queue) would fill it for good and every
// later call and reply would dial a queue of its own. p.mu held.
func (p *vqPool) evictLocked() *pooled {
	for to, l := range p.idle {
		if len(l) == 0 {
			delete(p.idle, to)
			continue
		}
		e := l[0]
		if len(l) == 1 {
			delete(p.idle, to)
		} else {
			p.idle[to] = l[1:]
		}
		p.nidle--
		return e
	}
	return nil
}

// retire releases a queue whose request may still be outstanding: its
// staging buffer goes with it, so nothing later lands in or leaves from it.
// The late replies in its inbox (to calls that gave up while waiting on
// it) go to late first: each frees its call's slot, which would otherwise
// stay taken until the session is torn down.
func (p *vqPool) retire(e *pooled) {
	p.mu.Lock()
	delete(p.all, e)
	p.mu.Unlock()
	if e.replies && p.late != nil {
		for k := len(e.msgs); k == len(e.msgs); {
			k = e.q.PopMsgs(e.msgs[:])
			for i := range e.msgs[:k] {
				p.late(&e.msgs[i])
				e.msgs[i] = krcore.Message{}
			}
		}
	}
	e.q.Close()
	if e.buf != nil {
		p.api.Deregister(e.buf)
	}
}

// close releases every queue, idle or in use (which wakes its waiter).
func (p *vqPool) close() {
	p.mu.Lock()
	p.closed = true
	all := p.all
	p.all, p.idle = nil, nil
	p.mu.Unlock()
	for e := range all {
		e.q.Close()
		p.api.Deregister(e.buf)
	}
}

// postImm WRITE_WITH_IMMs hdr, name and body to off of region at to.Node,
// notifying port to.Port, from e (a session's spare queue, connected to
// to) or, if nil, a queue of the pool, which it returns with the WRITE's completion
// owed: whoever waits for the WRITE's effect (a reply) reaps it after, or
// gives the queue back owing it (put), so that nobody waits for an
// acknowledgement it does not need. On error nothing was posted.
func (n *Node) postImm(ctx context.Context, e *pooled, to krcore.Principal, region krcore.Region, off int, hdr []byte, name string, body []byte, v imm) (*pooled, error) {
	p := &n.rpc.pool
	if e != nil && e.owed {
		if err := p.reap(ctx, e); err != nil { // e is retired
			if ctx.Err() != nil {
				return nil, err
			}
			e = nil
		}
	}
	if e == nil {
		var err error
		if e, err = p.get(ctx, to); err != nil {
			return nil, err
		}
	}
	b := e.buf.Bytes()
	k := copy(b, hdr)
	k += copy(b[k:], name)
	k += copy(b[k:], body)
	e.req[0] = krcore.Request{ID: 1, Op: verbs.OpWriteImm, Local: e.buf.Range(0, k), Remote: region.At(uint64(off)), Imm: v.encode()}
	if _, err := e.q.Push(ctx, true, e.req[:]...); err != nil {
		p.retire(e)
		return nil, err
	}
	e.owed = true
	return e, nil
}

// poll pops e's owed completion if it is there, and reports whether it
// was; err is its error status.
func (e *pooled) poll() (done bool, err error) {
	if e.q.Pop(e.out[:]) == 0 {
		return false, nil
	}
	e.owed = false
	return true, e.out[0].Err()
}

// reap waits for e's owed completion; on any error e is retired (a failed
// request may leave the queue in error, an unfinished one may still read
// its staging buffer).
func (p *vqPool) reap(ctx context.Context, e *pooled) error {
	_, err := e.await(ctx, func() bool { return false })
	if err != nil {
		p.retire(e)
	}
	return err
}

// await waits for e's owed completion, unless other, polled beside it
// while it spins, reports true first. done says whether the completion
// came; err is its error status, or the wait's.
func (e *pooled) await(ctx context.Context, other func() bool) (done bool, err error) {
	if spin(func() bool { done, err = e.poll(); return done || other() }) {
		return done, err
	}
	if _, err = e.q.PopWait(ctx, e.out[:]); err != nil {
		return false, err
	}
	e.owed = false
	return true, e.out[0].Err()
}

// spin polls ready a few times, yielding the processor between polls
// (on two cores the peer that will make it true, a soft RNIC or the
// serving goroutine, may need it), and reports whether it came true.
// Reading the clock to bound the spin cost more than the polls did.
func spin(ready func() bool) bool {
	for range rpcSpins {
		if ready() {
			return true
		}
		runtime.Gosched()
	}
	return ready()
}

// closeRPC stops the RPC side of a closing Node: services and endpoints
// close (their held calls get error replies, bounded by grace), new calls
// fail with ErrClosed.
func (n *Node) closeRPC(grace time.Duration) {
	r := n.rpcInit()
	r.mu.Lock()
	r.closed = true
	close(r.stop)
	svcs := make([]*Service, 0, len(r.services))
	for _, s := range r.services {
		svcs = append(svcs, s)
	}
	eps := make([]*Endpoint, 0, len(r.endpoints))
	for _, e := range r.endpoints {
		eps = append(eps, e)
	}
	r.mu.Unlock()
	for _, s := range svcs {
		s.Close()
	}
	for _, e := range eps {
		e.Close()
	}
	r.mu.Lock()
	r.draining = true
	r.mu.Unlock()
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
	}
	r.cancel()
	<-done
}

// releaseRPC withdraws every ring and reply area and closes the pool's
// queues; after serve stopped.
func (n *Node) releaseRPC() {
	r := &n.rpc
	r.mu.Lock()
	sessions := make([]*session, 0, len(r.sessions))
	for _, s := range r.sessions {
		sessions = append(sessions, s)
	}
	rings := r.rings
	r.rings = map[krcore.NodeID]*ring{}
	r.mu.Unlock()
	for _, s := range sessions {
		<-s.ready // a set-up in progress ends: its request fails once serve stopped
		n.teardown(s, krcore.ErrClosed)
	}
	for _, g := range rings {
		n.dropRing(g)
	}
	r.pool.close()
}

// errClosedNode is the error of a call the Node's Close ended.
var errClosedNode = fmt.Errorf("lite: node closed: %w", krcore.ErrClosed)

// wcFatal reports whether err from a request's WRITE ends its session: a
// work-completion error (the ring is gone, or the callee's node) does; a
// context's end does not.
func wcFatal(err error) bool {
	var st verbs.Status
	return errors.As(err, &st) || errors.Is(err, krcore.ErrPeerDead) || errors.Is(err, krcore.ErrUnreachable)
}

// putHdr encodes a request's header.
func putHdr(b []byte, id uint32, limit int, kind, nameLen uint8) {
	binary.LittleEndian.PutUint32(b, id)
	binary.LittleEndian.PutUint16(b[4:], uint16(limit))
	b[6], b[7] = kind, nameLen
}
