package soft

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// psnMask keeps PSNs to their 24 wire bits.
const psnMask = 1<<24 - 1

// wqe is a send work request as the send queue holds it: the caller's
// request copied, so the caller may reuse its slices once PostSend returns.
type wqe struct {
	wr       verbs.SendWR
	sgl      []verbs.SGE // wr.SGL's storage, reused slot to slot
	inline   []byte
	psn      uint32
	signaled bool
	sentAt   int64
	linkFrom int64  // first try while its link was being set up; 0 if none
	dest     string // DCI/UD destination address
}

// rwqe is a receive work request.
type rwqe struct {
	id  uint64
	sgl []verbs.SGE
}

// qp is a queue pair. One mutex guards both its requester state (the send
// queue) and its responder state (expected PSN, receive queue). It is never
// held while a frame is handed to a link, so two QPs sending to each other
// over the in-memory wire cannot deadlock, nor while a request's payload
// is read from a link's stream (readPayload): rx orders the requests a QP
// serves from streams instead.
type qp struct {
	node    *Node
	pd      *pd
	typ     verbs.QPType
	num     uint32
	scq     *cq
	rcq     *cq
	srq     *srq
	cap     verbs.QPCap
	sigAll  bool
	dcKey   uint64
	initPSN uint32

	deadline atomic.Int64  // when the oldest outstanding request expires; 0 if none
	tail     atomic.Uint64 // send queue slots below tail are free (retired by Poll)
	sqGen    atomic.Uint64 // send queue incarnation: bumped by every reset

	// rx is held by serve while it executes a request that came on a
	// stream (TCP or shm link), across the reads of its payload, during
	// which it releases mu: requests to one QP run one at a time and in
	// order, from any link (a DCT's initiators, a link and the one
	// replacing it), while posts, polls, Modify and Destroy go on. Taken
	// before mu.
	rx sync.Mutex

	mu       sync.Mutex
	state    verbs.QPState
	access   verbs.Access
	qkey     uint32
	dest     verbs.Endpoint
	mtu      int
	rnrTimer time.Duration // this QP's receiver-not-ready back-off, sent in RNR NAKs
	timeout  time.Duration // how long a request may wait for its response
	rnrRetry int
	rnrLeft  int
	nextPSN  uint32               // PSN of the next request transmitted (next)
	rqPSN    uint32               // PSN the responder expects next
	gen      uint32               // this incarnation's generation, new at every RTR->RTS
	dcSeq    map[dcSource]*dcConn // DCT: per-initiator sequencing
	// dcLast is the initiator of the DCT's last request and dcLastConn its
	// entry in dcSeq: requests come in runs from one initiator, and
	// hashing the source is a good part of a DC request's cost.
	dcLast     dcSource
	dcLastConn *dcConn

	sq                 []wqe
	done, sent, posted uint64   // completed <= transmitted <= posted
	pumping            bool     // a goroutine is transmitting the send queue
	carrying           bool     // the pump is carrying a request over the in-memory wire (see expire)
	windowHeld         bool     // the pump stopped at its window (windowFull)
	win                sqWindow // bytes in flight, for windowFull
	out                frame    // the request being transmitted (pump only)
	more               []frame  // requests batched behind out (pump only)
	rnrTimerT          *time.Timer
	rnrWait            bool // the head is waiting out an RNR back-off
	// halt is the status of the request at sent, which failed its local
	// check while earlier requests still waited for their responses: it
	// is reported (and the QP errored) once they are answered, as rxe's
	// completer reports an errored WQE only when it reaches the head.
	// Success while the requester is not halted.
	halt        verbs.Status
	link        link // RC/UC: the link to the connected peer
	rq          []rwqe
	rqHead, rqN int
	destroyed   bool
	// cut says what happened to the QP while serve read a request's
	// payload with mu released (readPayload): cutFlushed if it went to
	// ERR, cutReset if it was reset or destroyed.
	cut uint8
	// exported is the QP's entry in the node's export table as last
	// written (shmplace.go); all zero if none.
	exported [placeWords]uint64
	// dcAddr and dcLink are the in-memory link a DCI last routed to and
	// its address: a DCI's requests run to one target at a time, and
	// Node.route's lookup (a read lock and a string-keyed map) was a
	// tenth of a DC request's cost on the in-memory wire. Node.route
	// returns the same link for the address until its node closes, so
	// the cache is checked against that alone. Guarded by mu.
	dcAddr string
	dcLink *memLink
}

// CreateQP creates a QP in RESET.
func (p *pd) CreateQP(init verbs.QPInit) (verbs.QP, error) {
	n := p.node
	q, err := n.newQP(p, init)
	if err != nil {
		return nil, err
	}
	if err := n.reserve(&n.counts.qp, n.attr.MaxQP, "QP"); err != nil {
		return nil, err
	}
	if err := p.use(); err != nil {
		n.release(&n.counts.qp)
		return nil, err
	}
	q.scq.users.Add(1)
	q.rcq.users.Add(1)
	if q.srq != nil {
		q.srq.users.Add(1)
	}
	n.qpMu.Lock()
	for {
		n.nextQPN = (n.nextQPN + 1) & psnMask
		if _, taken := n.qps[n.nextQPN]; !taken && n.nextQPN > 1 {
			break
		}
	}
	q.num = n.nextQPN
	n.qps[q.num] = q
	n.qpMu.Unlock()
	if n.closed.Load() { // the node closed meanwhile: destroyAll may have missed q
		q.Close()
		return nil, errNodeClosed
	}
	return q, nil
}

// newQP validates init and builds the QP.
func (n *Node) newQP(p *pd, init verbs.QPInit) (*qp, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("soft: create %s QP: "+format, append([]any{init.Type}, a...)...)
	}
	switch init.Type {
	case verbs.RC, verbs.UC, verbs.UD:
	case verbs.DCI, verbs.DCT:
		if !n.attr.DCSupported {
			return nil, bad("the device has no DC transport (Config.NoDC): %w", verbs.ErrUnsupported)
		}
	default:
		return nil, bad("unknown type: %w", verbs.ErrInvalid)
	}
	scq, ok1 := init.SendCQ.(*cq)
	rcq, ok2 := init.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq.node != n || rcq.node != n {
		return nil, bad("send and receive CQs must be this node's: %w", verbs.ErrInvalid)
	}
	var s *srq
	if init.SRQ != nil {
		var ok bool
		if s, ok = init.SRQ.(*srq); !ok || s.pd.node != n {
			return nil, bad("SRQ must be this node's: %w", verbs.ErrInvalid)
		}
	}
	if init.Type == verbs.DCT && s == nil {
		return nil, bad("a DCT needs an SRQ: %w", verbs.ErrInvalid)
	}
	c := init.Cap
	a := n.attr
	if c.MaxSendWR > a.MaxQPWR || c.MaxRecvWR > a.MaxQPWR || c.MaxSendSGE > a.MaxSGE || c.MaxRecvSGE > a.MaxSGE || c.MaxInline > a.MaxInline {
		return nil, bad("capabilities %+v exceed the device's: %w", c, verbs.ErrLimit)
	}
	if c.MaxSendWR < 0 || c.MaxRecvWR < 0 || c.MaxSendSGE < 0 || c.MaxRecvSGE < 0 || c.MaxInline < 0 {
		return nil, bad("negative capabilities %+v: %w", c, verbs.ErrInvalid)
	}
	c.MaxSendWR, c.MaxSendSGE = max(c.MaxSendWR, 1), max(c.MaxSendSGE, 1)
	c.MaxRecvWR, c.MaxRecvSGE = max(c.MaxRecvWR, 1), max(c.MaxRecvSGE, 1)
	if init.Type == verbs.DCT {
		c.MaxSendWR = 0
	}
	q := &qp{
		node: n, pd: p, typ: init.Type, scq: scq, rcq: rcq, srq: s, cap: c,
		sigAll: init.SignalAll, dcKey: init.DCKey, initPSN: uint32(n.keys.next()) & psnMask,
		sq: make([]wqe, c.MaxSendWR),
	}
	slot := sgeSlots(len(q.sq), c.MaxSendSGE)
	for i := range q.sq {
		q.sq[i].sgl = slot(i)
	}
	if s == nil && init.Type != verbs.DCI {
		q.rq = make([]rwqe, c.MaxRecvWR)
		slot := sgeSlots(len(q.rq), c.MaxRecvSGE)
		for i := range q.rq {
			q.rq[i].sgl = slot(i)
		}
	}
	return q, nil
}

// sgeSlots cuts SGE storage for n queue slots of room SGEs each from one
// array made now, as a driver sizes a queue's buffer for its capabilities:
// slot(i) is empty with capacity room, so a request copied into a slot
// allocates nothing, even at the slot's first use.
func sgeSlots(n, room int) func(i int) []verbs.SGE {
	buf := make([]verbs.SGE, n*room)
	return func(i int) []verbs.SGE { return buf[i*room : i*room : (i+1)*room] }
}

func (q *qp) Num() uint32        { return q.num }
func (q *qp) Type() verbs.QPType { return q.typ }

func (q *qp) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *qp) Endpoint() verbs.Endpoint {
	return verbs.Endpoint{Addr: q.node.addr, QPN: q.num, PSN: q.initPSN}
}

// Close destroys the QP; outstanding work is dropped without completions.
func (q *qp) Close() error {
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return fmt.Errorf("soft: destroy QP %d: %w", q.num, verbs.ErrClosed)
	}
	q.destroyed = true
	q.state = verbs.StateErr
	q.resetQueues()
	q.syncExport()
	q.mu.Unlock()
	n := q.node
	n.qpMu.Lock()
	delete(n.qps, q.num)
	n.qpMu.Unlock()
	q.scq.users.Add(-1)
	q.rcq.users.Add(-1)
	if q.srq != nil {
		q.srq.users.Add(-1)
	}
	q.pd.refs.Add(-1)
	n.release(&n.counts.qp)
	return nil
}

// resetQueues empties both queues without completions; q.mu is held.
func (q *qp) resetQueues() {
	clear(q.sq)
	q.done, q.sent, q.posted = 0, 0, 0
	q.sqGen.Add(1)
	q.tail.Store(0)
	q.deadline.Store(0)
	q.rnrWait = false
	q.halt = verbs.Success
	if q.rnrTimerT != nil {
		q.rnrTimerT.Stop()
	}
	q.link = nil
	clear(q.rq)
	q.rqHead, q.rqN = 0, 0
	q.cut = cutReset
	q.dcSeq, q.dcLastConn = nil, nil
}

// dcSource names one DCI incarnation sending to a DCT.
type dcSource struct {
	addr string
	qpn  uint32
}

// dcConn is a DCT's sequencing state for one initiator.
type dcConn struct {
	gen    uint32
	expect uint32
}

// maxDCSources bounds a DCT's sequencing table; past it the table starts
// over, which only costs initiators a fresh start.
const maxDCSources = 1 << 14

// dcInSequence reports whether a DCI request is the next one expected from
// its sender, starting a new sequence for a new generation; q.mu is held.
func (q *qp) dcInSequence(peer string, f *frame) (*dcConn, bool) {
	c := q.dcLastConn
	if c == nil || q.dcLast.qpn != f.srcQPN || !sameString(q.dcLast.addr, peer) {
		src := dcSource{peer, f.srcQPN}
		if c = q.dcSeq[src]; c == nil {
			if q.dcSeq == nil || len(q.dcSeq) >= maxDCSources {
				q.dcSeq = make(map[dcSource]*dcConn)
			}
			c = &dcConn{gen: f.gen, expect: f.psn}
			q.dcSeq[src] = c
		}
		q.dcLast, q.dcLastConn = src, c
	}
	if c.gen != f.gen || f.flags&flagDCConnect != 0 {
		c.gen, c.expect = f.gen, f.psn
	}
	return c, c.expect == f.psn
}

// sameString is a == b, deciding without comparing bytes when both are
// the same string (a link's peer address, a request's destination): the
// per-request checks of the DC path compare a string with itself.
func sameString(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || unsafe.StringData(a) == unsafe.StringData(b) || a == b
}

// Modify applies a state transition: verbs.CheckTransition decides
// whether it is legal and which attributes it applies. The soft RNIC has
// no send-queue drain, so SQD is refused as unsupported.
func (q *qp) Modify(a verbs.QPAttr) error {
	if err := q.node.checkOpen(); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return fmt.Errorf("soft: modify QP %d: %w", q.num, verbs.ErrClosed)
	}
	mask, err := verbs.CheckTransition(q.typ, q.state, a)
	if err != nil {
		return fmt.Errorf("soft: modify QP %d: %w", q.num, err)
	}
	switch a.State {
	case verbs.StateReset:
		q.resetQueues()
	case verbs.StateErr:
		q.failLocked(verbs.WRFlushErr, 0, false)
		return nil
	case verbs.StateInit:
		q.toInit(mask, a)
	case verbs.StateRTR:
		if err := q.toRTR(mask, a); err != nil {
			return fmt.Errorf("soft: modify %s QP %d %s->%s: %w", q.typ, q.num, q.state, a.State, err)
		}
	case verbs.StateRTS:
		q.toRTS(mask, a)
	case verbs.StateSQD:
		return fmt.Errorf("soft: modify %s QP %d %s->SQD: no send queue drain: %w", q.typ, q.num, q.state, verbs.ErrUnsupported)
	}
	q.state = a.State
	q.syncExport()
	return nil
}

// toInit applies INIT's attributes.
func (q *qp) toInit(mask verbs.QPAttrMask, a verbs.QPAttr) {
	if mask&verbs.AttrAccess != 0 {
		q.access = a.Access
	}
	if mask&verbs.AttrQKey != 0 {
		q.qkey = a.QKey
	}
}

// toRTR applies RTR's attributes over the node's defaults.
func (q *qp) toRTR(mask verbs.QPAttrMask, a verbs.QPAttr) error {
	if mask&verbs.AttrDest != 0 {
		if a.Dest.Addr == "" {
			return fmt.Errorf("Dest has no fabric address: %w", verbs.ErrInvalid)
		}
		q.dest = a.Dest
		q.rqPSN = a.Dest.PSN & psnMask
	}
	q.mtu = q.node.mtu
	if mask&verbs.AttrPathMTU != 0 && a.MTU > 0 {
		q.mtu = min(a.MTU, q.node.mtu)
	}
	q.rnrTimer = DefaultRNRTimer
	if mask&verbs.AttrMinRNRTimer != 0 && a.MinRNRTimer > 0 {
		q.rnrTimer = a.MinRNRTimer
	}
	return nil
}

// toRTS applies RTS's attributes over the node's defaults when the QP
// comes from RTR, and starts a new generation; RTS -> RTS applies none.
// Beyond the mask, a UD or UC QP's Timeout bounds how long a request
// waits for its link to come up: the verbs rules give those transports no
// timeout, having no such wait, but the soft fabric dials its links.
func (q *qp) toRTS(mask verbs.QPAttrMask, a verbs.QPAttr) {
	if q.state != verbs.StateRTR {
		return
	}
	for old := q.gen; q.gen == old; {
		q.gen = uint32(q.node.keys.next()) // never the previous life's
	}
	q.nextPSN = a.SQPSN & psnMask
	q.timeout = q.node.cfg.RetryTimeout
	if a.Timeout > 0 && (mask&verbs.AttrTimeout != 0 || q.typ == verbs.UD || q.typ == verbs.UC) {
		q.timeout = a.Timeout * time.Duration(min(max(a.RetryCount, 0), 7)+1)
	}
	q.rnrRetry = 0
	if mask&verbs.AttrRNRRetry != 0 {
		q.rnrRetry = a.RNRRetry
	}
	q.rnrLeft = q.rnrRetry
}

// PostSend queues send work requests and starts transmitting them.
func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	if err := q.node.checkOpen(); err != nil {
		return 0, err
	}
	q.mu.Lock()
	for i := range wrs {
		if err := q.enqueue(&wrs[i]); err != nil {
			q.mu.Unlock()
			if i > 0 {
				q.pump()
			}
			return i, err
		}
	}
	flush := q.state == verbs.StateErr
	q.mu.Unlock()
	if flush {
		q.fail(verbs.WRFlushErr)
	} else {
		q.pump()
	}
	return len(wrs), nil
}

// enqueue checks one request the way a driver's post_send does and copies
// it into the send queue; q.mu is held.
func (q *qp) enqueue(wr *verbs.SendWR) error {
	bad := func(err error, format string, a ...any) error {
		return fmt.Errorf("soft: post %s on %s QP %d: %s: %w", wr.Op, q.typ, q.num, fmt.Sprintf(format, a...), err)
	}
	switch {
	case q.destroyed:
		return bad(verbs.ErrClosed, "QP destroyed")
	case q.state != verbs.StateRTS && q.state != verbs.StateErr:
		return bad(verbs.ErrQPState, "QP is %s, not RTS", q.state)
	case !q.typ.Supports(wr.Op):
		return bad(verbs.ErrInvalid, "opcode not valid for the transport")
	case len(wr.SGL) > q.cap.MaxSendSGE:
		return bad(verbs.ErrLimit, "%d SGEs, max %d", len(wr.SGL), q.cap.MaxSendSGE)
	case q.posted-q.tail.Load() >= uint64(len(q.sq)):
		return bad(verbs.ErrQueueFull, "%d requests outstanding", len(q.sq))
	}
	var dest string
	if q.typ == verbs.UD || q.typ == verbs.DCI {
		h, ok := wr.AH.(*ah)
		if !ok || h.dead.Load() || h.pd.node != q.node {
			return bad(verbs.ErrInvalid, "needs a live address handle of this node")
		}
		dest = h.dest.Addr
	}
	w := &q.sq[q.posted%uint64(len(q.sq))]
	if wr.Flags&verbs.Inline != 0 {
		if err := q.copyInline(w, wr); err != nil {
			return bad(err, "inline data")
		}
	} else {
		w.inline = w.inline[:0]
	}
	w.wr = *wr
	w.wr.AH = nil // the destination address is kept; the handle may close
	w.sgl = append(w.sgl[:0], wr.SGL...)
	w.wr.SGL = w.sgl
	w.signaled = q.sigAll || wr.Flags&verbs.Signaled != 0
	w.sentAt, w.linkFrom = 0, 0
	w.dest = dest
	q.posted++
	return nil
}

// copyInline gathers an inline send's data now, as the CPU does on
// hardware: the SGEs' memory may be reused once PostSend returns.
func (q *qp) copyInline(w *wqe, wr *verbs.SendWR) error {
	total := wr.Len()
	if total > q.cap.MaxInline {
		return fmt.Errorf("%d bytes, max %d: %w", total, q.cap.MaxInline, verbs.ErrLimit)
	}
	if wr.Op != verbs.OpSend && wr.Op != verbs.OpSendImm && wr.Op != verbs.OpWrite && wr.Op != verbs.OpWriteImm {
		return verbs.ErrInvalid
	}
	w.inline = w.inline[:0]
	for _, s := range wr.SGL {
		b, err := offheap.Slice(s.Addr, int(s.Length))
		if err != nil {
			return fmt.Errorf("%w: %w", verbs.ErrInvalid, err)
		}
		w.inline = append(w.inline, b...)
	}
	return nil
}

// sqIdxBits holds a send queue index in a completion's retirement tag; the
// bits above hold the queue's incarnation.
const sqIdxBits = 40

// retireTag names send queue slot idx of the current incarnation.
func (q *qp) retireTag(idx uint64) uint64 { return q.sqGen.Load()<<sqIdxBits | idx }

// retire frees send queue slots up to and including the tagged one: called
// by Poll for each send completion it returns, as mlx5 advances its SQ
// tail. Completions from before a reset free nothing.
func (q *qp) retire(tag uint64) {
	if tag>>sqIdxBits != q.sqGen.Load()&(1<<(64-sqIdxBits)-1) {
		return
	}
	idx := tag & (1<<sqIdxBits - 1)
	for {
		t := q.tail.Load()
		if idx+1 <= t || q.tail.CompareAndSwap(t, idx+1) {
			return
		}
	}
}

// complete reports the head-most outstanding send request's outcome; q.mu
// is held. A failure moves the QP to ERR and flushes everything behind it.
// Completions are in order: once the last request before a halted one is
// answered, the halted one's local error is reported.
func (q *qp) complete(w *wqe, idx uint64, st verbs.Status, byteLen uint32) {
	if st != verbs.Success {
		q.failLocked(st, idx, true)
		return
	}
	q.done = idx + 1
	q.rnrLeft = q.rnrRetry
	if w.signaled {
		q.pushSend(w, idx, verbs.Success, byteLen)
	}
	if q.halt != verbs.Success && q.done == q.sent {
		q.failLocked(q.halt, q.done, true)
		return
	}
	q.armDeadline(true)
}

// pushSend queues a send completion; a CQ overrun errors the QP.
func (q *qp) pushSend(w *wqe, idx uint64, st verbs.Status, byteLen uint32) bool {
	wc := verbs.WC{ID: w.wr.ID, Status: st, QPN: q.num, ByteLen: byteLen}
	if st == verbs.Success {
		wc.Op = verbs.CompletionOf(w.wr.Op)
	}
	if !q.scq.push(cqe{wc: wc, q: q, sqIdx: q.retireTag(idx)}) {
		q.state = verbs.StateErr
		q.syncExport()
		return false
	}
	return true
}

// armDeadline sets when the oldest transmitted request times out; q.mu is
// held. A UD or UC request awaits no response: it is done once on the
// wire (pump completes it after the send, with q.mu released), so nothing
// may time it out meanwhile, however long the sender is delayed there.
//
// progress says a request just completed. As on an RNIC, the transport
// timer measures time without progress: each answer restarts it for the
// requests still out, so a deep queue answered in order is not failed
// while its answers keep coming. Timed from its own transmission, the
// last of 128 64 KiB READs waited for the 127 responses before it, 8 MiB
// on a link that a loaded machine moves at a few MB/s, and failed
// RETRY_EXC_ERR mid-stream (TestTCPManyLargeReads at nice 19 beside busy
// loops).
func (q *qp) armDeadline(progress bool) {
	if q.done == q.sent || q.rnrWait || q.typ == verbs.UD || q.typ == verbs.UC {
		q.deadline.Store(0)
		return
	}
	from := q.sq[q.done%uint64(len(q.sq))].sentAt
	if progress {
		from = max(from, q.node.now())
	}
	q.deadline.Store(from + int64(q.timeout))
}

// fail moves the QP to ERR with every outstanding request completing st
// (WR_FLUSH_ERR when the QP is merely flushed).
func (q *qp) fail(st verbs.Status) {
	q.mu.Lock()
	q.failLocked(st, q.done, false)
	q.mu.Unlock()
}

// failLocked errors the QP. If culprit, the request at idx completes with st
// and the rest with WR_FLUSH_ERR; otherwise all complete with st. A request
// never completes SUCCESS here: the culprit is always the oldest
// outstanding request (complete and next see to it), and anything still
// outstanding has not been answered, so it is flushed.
func (q *qp) failLocked(st verbs.Status, idx uint64, culprit bool) {
	if q.destroyed {
		return
	}
	q.state = verbs.StateErr
	q.rnrWait = false
	q.halt = verbs.Success
	q.deadline.Store(0)
	for i := q.done; i < q.posted; i++ {
		s := verbs.WRFlushErr
		if !culprit || i == idx {
			s = st
		}
		q.pushSend(&q.sq[i%uint64(len(q.sq))], i, s, 0)
	}
	q.done, q.sent = q.posted, q.posted
	q.flushRecvs()
	q.cut = max(q.cut, cutFlushed) // a reset since stands
	q.syncExport()
}

// flushRecvs completes every posted receive with WR_FLUSH_ERR; q.mu held.
func (q *qp) flushRecvs() {
	for ; q.rqN > 0; q.rqN-- {
		r := &q.rq[q.rqHead]
		q.rcq.push(cqe{wc: verbs.WC{ID: r.id, Status: verbs.WRFlushErr, Op: verbs.WCRecv, QPN: q.num}})
		q.rqHead = (q.rqHead + 1) % len(q.rq)
	}
}

// expire fails the QP if its oldest request is still unanswered at now: the
// retry count is exhausted. UD has no retry count: a datagram whose link
// did not come up by then is lost (as one to an unreachable port is, see
// next) and the datagrams behind it go on; a UD QP never goes to ERR for
// its destinations, or a control QP that only answers would stop hearing.
//
// Nothing expires while the pump carries a request over the in-memory
// wire: the peer serves it, and its response lands, inside that send, so
// the time is the requesting goroutine's own, not the peer's (a dead peer
// drops it at once). Expired then, a READ was failed RETRY_EXC_ERR while
// its own goroutine, descheduled, still carried it out (krbench demo's
// mesh under -race at load 35, a 1 s timeout).
func (q *qp) expire(now int64) {
	q.mu.Lock()
	if d := q.deadline.Load(); d == 0 || d >= now || q.done == q.posted || q.carrying {
		q.mu.Unlock()
		return
	}
	w := &q.sq[q.done%uint64(len(q.sq))]
	if q.typ != verbs.UD {
		q.complete(w, q.done, verbs.RetryExcErr, 0)
		q.mu.Unlock()
		return
	}
	if q.sent == q.done {
		q.sent++
	}
	q.complete(w, q.done, verbs.Success, 0)
	q.mu.Unlock()
	q.pump()
}

// PostRecv queues receive buffers.
func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if err := q.node.checkOpen(); err != nil {
		return 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range wrs {
		bad := func(err error, format string, a ...any) error {
			return fmt.Errorf("soft: post receive on %s QP %d: %s: %w", q.typ, q.num, fmt.Sprintf(format, a...), err)
		}
		switch {
		case q.destroyed:
			return i, bad(verbs.ErrClosed, "QP destroyed")
		case q.rq == nil:
			return i, bad(verbs.ErrInvalid, "QP has no receive queue (SRQ or DCI)")
		case q.state == verbs.StateReset:
			return i, bad(verbs.ErrQPState, "QP is RESET")
		case len(wrs[i].SGL) > q.cap.MaxRecvSGE:
			return i, bad(verbs.ErrLimit, "%d SGEs, max %d", len(wrs[i].SGL), q.cap.MaxRecvSGE)
		case q.rqN == len(q.rq):
			return i, bad(verbs.ErrQueueFull, "%d receives posted", q.rqN)
		}
		r := &q.rq[(q.rqHead+q.rqN)%len(q.rq)]
		r.id = wrs[i].ID
		r.sgl = append(r.sgl[:0], wrs[i].SGL...)
		q.rqN++
		if q.state == verbs.StateErr {
			q.flushRecvs()
		}
	}
	return len(wrs), nil
}

// untakeRecv puts back the receive takeRecv just took, for a SEND whose
// payload never wholly arrived because its link died: as a message lost
// on the wire, it consumes no receive. It reports false if the receive
// could not be put back (its queue filled while the payload was read).
func (q *qp) untakeRecv(id uint64, sgl []verbs.SGE) bool {
	if q.srq != nil {
		return q.srq.untake(id, sgl)
	}
	if q.rqN == len(q.rq) {
		return false // posted to the brim while the payload was read
	}
	q.rqHead = (q.rqHead + len(q.rq) - 1) % len(q.rq)
	r := &q.rq[q.rqHead]
	r.id, r.sgl = id, append(r.sgl[:0], sgl...)
	q.rqN++
	return true
}

// takeRecv removes the oldest posted receive, from the SRQ if the QP has
// one, appending its SGEs to sgl; q.mu is held.
func (q *qp) takeRecv(sgl []verbs.SGE) (uint64, []verbs.SGE, bool) {
	if q.srq != nil {
		return q.srq.take(sgl)
	}
	if q.rqN == 0 {
		return 0, sgl, false
	}
	r := &q.rq[q.rqHead]
	q.rqHead = (q.rqHead + 1) % len(q.rq)
	q.rqN--
	return r.id, append(sgl, r.sgl...), true
}
