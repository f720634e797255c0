package soft

import (
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/krcore/krcore/verbs"
)

// flagDC marks a request from a DCI, so a responder can NAK an unknown DCT
// number instead of dropping the request as it does for RC.
const flagDC = 1 << 2

// flagDCConnect marks a DCI request sent with nothing else in flight: like
// hardware's DC connect, it (re)starts the target's sequencing of this
// initiator, which may have talked to other targets meanwhile.
const flagDCConnect = 1 << 3

// pump transmits the send queue in order. Whoever finds the pump idle runs
// it; other posters only enqueue. On the in-memory wire a request's
// response is handled inside send, so a post often completes before
// PostSend returns.
func (q *qp) pump() {
	q.mu.Lock()
	if q.pumping {
		q.mu.Unlock()
		return
	}
	q.pumping = true
	var unrung *shmLink // a link this pump left its peer unrung on
	for {
		lk, idx, ok := q.next(&q.out)
		if !ok {
			break
		}
		sl, shm := lk.(*shmLink)
		if unrung != nil && unrung != sl {
			unrung.flushWake()
			unrung = nil
		}
		// More of this pump's requests follow on the link: the peer's
		// reader, if asleep, is rung once for them all (after the
		// last), so that it wakes to a whole WRITE_WITH_IMM to a port
		// (a WRITE and its notification) instead of waking for the
		// WRITE alone, taking this CPU, and sleeping again before
		// the notification is in. A large frame rings at once, as
		// before: the peer copies it out while the next goes in.
		lazy := shm && q.sent < q.posted && q.out.payloadLen() <= shmLazyBytes
		// An RC QP or a DCI on a TCP link writes what is queued in one
		// call. An RC QP's requests all go on q.link, which only a reset
		// (under q.mu) changes; a DCI's, on the link of their target,
		// which next keeps the same while any is in flight.
		tl, tcp := lk.(*tcpLink)
		n := 0
		if tcp && (q.typ == verbs.RC || q.typ == verbs.DCI) {
			if q.more == nil && q.sent < q.posted {
				q.more = make([]frame, pumpBatch-1)
			}
			for size := q.out.payloadLen(); n < len(q.more) && size < pumpBatchBytes; n++ {
				if _, _, ok := q.next(&q.more[n]); !ok {
					break
				}
				size += q.more[n].payloadLen()
			}
		}
		_, mem := lk.(*memLink)
		q.carrying = mem
		q.mu.Unlock()
		if n > 0 {
			tl.sendBatch(&q.out, q.more[:n])
			for i := range q.more[:n] {
				q.more[i].release()
			}
		} else if shm {
			sl.sendFrame(&q.out, lazy)
			if lazy {
				unrung = sl
			}
		} else {
			lk.send(&q.out)
		}
		q.out.release()
		if tcp {
			q.scq.setLink(tl)
			q.rcq.setLink(tl)
		} else if shm {
			q.scq.setShm(sl)
			q.rcq.setShm(sl)
		}
		q.mu.Lock()
		q.carrying = false
		if q.typ == verbs.UD || q.typ == verbs.UC {
			// Unreliable: done once it is on the wire.
			if q.done == idx && q.sent > idx && q.state == verbs.StateRTS {
				q.complete(&q.sq[idx%uint64(len(q.sq))], idx, verbs.Success, q.out.rlen)
			}
		}
	}
	q.pumping = false
	q.mu.Unlock()
	if unrung != nil {
		unrung.flushWake()
	}
}

// shmLazyBytes bounds the payload of a request frame whose ring of a
// sleeping peer waits for the next frame of the same pump (see pump).
const shmLazyBytes = 4 << 10

// Bounds on what the pump writes to a TCP link in one call.
const (
	pumpBatch      = 16
	pumpBatchBytes = 256 << 10
)

// next prepares the next request for the wire in out and returns the link
// to send it on; q.mu is held. A request that fails local checks completes
// here with its error.
func (q *qp) next(out *frame) (link, uint64, bool) {
	for q.state == verbs.StateRTS && !q.rnrWait && q.halt == verbs.Success && q.sent < q.posted && !q.destroyed {
		idx := q.sent
		w := &q.sq[idx%uint64(len(q.sq))]
		if q.typ == verbs.DCI && q.done < idx && q.sq[(idx-1)%uint64(len(q.sq))].dest != w.dest {
			return nil, 0, false // a DCI serves one target at a time
		}
		if w.sentAt == 0 {
			w.sentAt = q.node.now()
		}
		lk := q.route(w)
		if lk == nil && q.typ == verbs.UD && q.done == idx && q.node.unreachable(w.dest) {
			// UD never waits for its destination: a datagram to a
			// port that is gone is lost on the wire, as on any
			// fabric. Waiting would hold every datagram queued
			// behind it (to live ports) until the retry timeout
			// failed the QP, flushing its receives too.
			q.sent++
			q.complete(w, idx, verbs.Success, 0)
			continue
		}
		if lk == nil {
			q.awaitLink(w, idx)
			return nil, 0, false
		}
		if sl, ok := lk.(*shmLink); ok && q.typ == verbs.RC && q.done == idx {
			if k, ok := sl.inPlace(q, w); ok {
				q.sent++
				q.complete(w, idx, verbs.Success, k)
				continue
			}
		}
		if q.holdOff(lk, w) {
			// The transport timer starts when the request goes out, as
			// on an RNIC; until then it bounds how long the link's
			// queue may go without draining (each drain pumps q again,
			// which re-arms it), so a peer that stopped reading still
			// fails q's requests.
			if q.done == idx {
				q.deadline.Store(q.node.now() + int64(q.timeout))
			}
			w.sentAt = 0
			return nil, 0, false
		}
		if !w.wr.Op.IsAtomic() && q.windowFull(lk, w) {
			q.windowHeld = true // a response that completes pumps q
			w.sentAt = 0
			return nil, 0, false
		}
		q.windowHeld = false
		// PSNs number what goes on the wire, in order: a request
		// carried out in place (shmplace.go) takes none, so the
		// responder's expected PSN stays in step.
		w.psn = q.nextPSN
		if st := q.build(w, out); st != verbs.Success {
			out.release()
			if q.done < idx {
				// Earlier requests still wait for their responses
				// (READ data, atomics, ACKs): they complete when those
				// arrive, then this one with st (see complete).
				q.halt = st
				return nil, 0, false
			}
			q.complete(w, idx, st, 0)
			continue
		}
		if q.typ == verbs.DCI && q.done == idx {
			out.flags |= flagDCConnect
		}
		q.sent++
		q.nextPSN = (w.psn + 1) & psnMask
		if q.done == idx {
			q.armDeadline(false)
		}
		return lk, idx, true
	}
	return nil, 0, false
}

// holdOff reports whether the pump stops before w because lk's queue is
// draining (write.go, shmring.go); the drain pumps q again once the queue
// is empty. Only RC QPs and DCIs hold off: their pump writes batches. A
// request without payload (a READ, an atomic) never holds off: holding
// off saves copying a payload into the queue, and it has none, only a
// header; held, it could wait as long as the link's reader kept queueing
// responses to the peer's READs, the queue emptying only when the peer
// paused (both nodes READing each other 128 deep: a READ held for the
// whole 10 s retry timeout, TestTCPManyLargeReads at nice 19).
func (q *qp) holdOff(lk link, w *wqe) bool {
	if q.typ != verbs.RC && q.typ != verbs.DCI || w.wr.Op == verbs.OpRead || w.wr.Op.IsAtomic() {
		return false
	}
	switch l := lk.(type) {
	case *tcpLink:
		return l.holdOff(q)
	case *shmLink:
		return l.holdOff(q)
	}
	return false
}

// shmWindow bounds the bytes a QP has in flight on a shared-memory link in
// each direction: READ responses to come, and WRITE and SEND payloads
// sent, as an RNIC bounds outstanding READs (max_rd_atomic) and its send
// window. Either must fit a ring: a READ responder's reader never waits
// for room, so what does not fit the peer's ring would be copied into its
// link's queue first; a requester's WRITEs past the ring would wait there
// for a wake-up each time a quarter of it is read, rather than go as each
// ACK comes back.
const shmWindow = ShmRingSize - 64<<10

// windowFull reports whether w would take q's bytes in flight on lk, in
// w's direction, past shmWindow; with nothing in flight it never does.
// q.mu is held.
func (q *qp) windowFull(lk link, w *wqe) bool {
	if _, ok := lk.(*shmLink); !ok || q.done == q.sent {
		return false
	}
	read := w.wr.Op == verbs.OpRead
	k := 0
	if read {
		k = 1
	}
	return q.win.inFlight(q)[k]+uint64(w.wr.Len()) > shmWindow
}

// sqWindow keeps the bytes of q's requests in flight, [lo, hi) of the send
// queue, in each direction, moved on as requests go out and complete: a
// sum over every request in flight per request made a deep queue of small
// requests quadratic. by holds each counted request's bytes, by slot, as
// they were added: a retired slot may already hold a later request.
type sqWindow struct {
	lo, hi uint64
	gen    uint64
	sum    [2]uint64 // WRITE and SEND bytes, READ bytes
	by     []uint64  // bytes, with winRead set for a READ
}

const winRead = 1 << 63

// inFlight brings the window to q's requests in flight, [done, sent), and
// returns its sums; q.mu is held.
func (s *sqWindow) inFlight(q *qp) [2]uint64 {
	n := uint64(len(q.sq))
	if g := q.sqGen.Load(); s.gen != g || len(s.by) != len(q.sq) || s.hi > q.sent || s.hi < q.done {
		// A reset, a first use, a rewind (an RNR NAK resends) or
		// everything counted completed: count afresh from done.
		*s = sqWindow{lo: q.done, hi: q.done, gen: g, by: s.by}
		if len(s.by) != len(q.sq) {
			s.by = make([]uint64, len(q.sq))
		}
	}
	for ; s.lo < q.done; s.lo++ {
		b := s.by[s.lo%n]
		s.sum[b>>63] -= b &^ winRead
	}
	for ; s.hi < q.sent; s.hi++ {
		x := &q.sq[s.hi%n]
		b := uint64(0)
		if !x.wr.Op.IsAtomic() {
			b = uint64(x.wr.Len())
		}
		if x.wr.Op == verbs.OpRead {
			b |= winRead
		}
		s.by[s.hi%n] = b
		s.sum[b>>63] += b &^ winRead
	}
	return s.sum
}

// route finds the link a request travels on; nil while none is up yet.
func (q *qp) route(w *wqe) link {
	switch q.typ {
	case verbs.RC, verbs.UC:
		if q.link == nil {
			q.link = q.node.route(q.dest.Addr, q)
		}
		return q.link
	}
	if l := q.dcLink; l != nil && sameString(q.dcAddr, w.dest) && !l.to.closed.Load() {
		return l
	}
	lk := q.node.route(w.dest, q)
	if ml, ok := lk.(*memLink); ok {
		q.dcAddr, q.dcLink = w.dest, ml
	}
	return lk
}

// awaitLink arms the timeout of w, the request at idx, which waits for a
// link to its destination; q.mu is held. The transport timer starts when a
// request goes out, as on an RNIC: while a link is being set up (a TCP
// connect, a shared-memory hello: DialTimeout bounds each) an RC or DC
// request has not gone out, so it may wait DialTimeout more than its own
// timeout from its first try, and its timer restarts when it goes out.
// Redials do not extend that bound, and once no set-up is under way the
// timeout from its first try applies. A datagram waits its timeout only:
// one whose link does not come up is lost (next).
func (q *qp) awaitLink(w *wqe, idx uint64) {
	dest, from := w.dest, w.sentAt
	if q.typ == verbs.RC || q.typ == verbs.UC {
		dest = q.dest.Addr
	}
	if w.linkFrom != 0 {
		from = w.linkFrom
	}
	wait := q.timeout
	if (q.typ == verbs.RC || q.typ == verbs.DCI) && q.node.linkComing(dest) {
		w.linkFrom, w.sentAt = from, 0
		wait += q.node.cfg.DialTimeout
	}
	if q.done == idx {
		q.deadline.Store(from + int64(wait))
	}
}

// build fills f with w's request, checking the local side: SGEs inside
// this PD's MRs with the access the operation needs, and lengths.
func (q *qp) build(w *wqe, f *frame) verbs.Status {
	wr := &w.wr
	*f = frame{typ: frameRequest, op: wr.Op, srcQPN: q.num, psn: w.psn, gen: q.gen, segs: f.segs[:0], held: f.held[:0]}
	switch q.typ {
	case verbs.RC, verbs.UC:
		f.dstQPN = q.dest.QPN
	case verbs.UD:
		f.dstQPN, f.rkey = wr.RemoteQPN, wr.QKey
	case verbs.DCI:
		f.dstQPN, f.dckey, f.flags = wr.RemoteQPN, wr.DCKey, flagDC
	}
	if wr.Op.HasImm() {
		f.flags |= flagImm
		f.imm = wr.Imm
	}
	if wr.Flags&verbs.Solicited != 0 {
		f.flags |= flagSolicited
	}
	if wr.Op != verbs.OpSend && wr.Op != verbs.OpSendImm {
		f.raddr, f.rkey = wr.RemoteAddr, wr.RKey
	}
	total := wr.Len()
	switch {
	case uint32(total) > q.node.attr.MaxMsgSize:
		return verbs.LocLenErr
	case q.typ == verbs.UD && total > q.mtu:
		return verbs.LocLenErr
	}
	switch wr.Op {
	case verbs.OpRead:
		f.rlen = uint32(total)
		return q.checkLocal(wr.SGL, verbs.AccessLocalWrite)
	case verbs.OpCompareSwap, verbs.OpFetchAdd:
		if len(wr.SGL) != 1 || wr.SGL[0].Length != 8 {
			return verbs.LocLenErr
		}
		f.rlen, f.cmp, f.swap = 8, wr.CompareAdd, wr.Swap
		return q.checkLocal(wr.SGL, verbs.AccessLocalWrite)
	}
	f.rlen = uint32(total)
	if wr.Flags&verbs.Inline != 0 {
		if len(w.inline) > 0 {
			f.segs = append(f.segs, w.inline)
		}
		return verbs.Success
	}
	for _, s := range wr.SGL {
		m, b, ok := q.node.acquire(s.LKey, q.pd, s.Addr, uint64(s.Length), 0)
		if !ok {
			return verbs.LocProtErr
		}
		f.held = append(f.held, m)
		if len(b) > 0 {
			f.segs = append(f.segs, b)
		}
	}
	return verbs.Success
}

// checkLocal checks that a READ's or atomic's landing SGEs are valid now,
// as hardware does when it fetches the WQE.
func (q *qp) checkLocal(sgl []verbs.SGE, need verbs.Access) verbs.Status {
	for _, s := range sgl {
		m, _, ok := q.node.acquire(s.LKey, q.pd, s.Addr, uint64(s.Length), need)
		if !ok {
			return verbs.LocProtErr
		}
		m.done()
	}
	return verbs.Success
}

// release drops the MR holds a frame's payload took.
func (f *frame) release() {
	for i, m := range f.held {
		m.done()
		f.held[i] = nil
	}
	f.held = f.held[:0]
}

// ackOnly reports whether a successful op is answered by a plain ACK,
// which a later ACK may stand for.
func ackOnly(op verbs.Opcode) bool {
	return op == verbs.OpWrite || op == verbs.OpWriteImm || op == verbs.OpSend || op == verbs.OpSendImm
}

// onResponse matches a response to the oldest transmitted request. An ACK
// for a later request acknowledges the ones before it too (ACKs are
// cumulative): they are WRITEs and SENDs whose own ACKs were coalesced. A
// DCI's ACKs coalesce too: it changes targets only with nothing in flight,
// so every request an ACK covers went to the DCT that sent it.
func (q *qp) onResponse(f *frame, r io.Reader) {
	q.mu.Lock()
	q.answer(f, r)
	// A DCI stops transmitting at a request for another target while
	// requests to the current one are in flight (next); once they are all
	// answered, it resumes here, unless a pump is running (the in-memory
	// wire answers inside the pump's own send) and will go on by itself.
	// So does a QP that stopped at its window (windowFull).
	resume := q.state == verbs.StateRTS && q.sent < q.posted && !q.pumping &&
		(q.typ == verbs.DCI && q.done == q.sent || q.windowHeld)
	q.mu.Unlock()
	if resume {
		q.pump()
	}
}

// answer applies a response to the requests it answers; q.mu is held.
func (q *qp) answer(f *frame, r io.Reader) {
	if q.done >= q.sent || q.typ == verbs.UD || q.typ == verbs.UC || f.gen != q.gen {
		// Stale: the QP was flushed, or the response answers a request
		// from before a reset (another generation), whose PSNs the new
		// requests may reuse.
		return
	}
	idx := q.done
	w := &q.sq[idx%uint64(len(q.sq))]
	if f.psn != w.psn {
		skip := uint64((f.psn - w.psn) & psnMask)
		if q.typ != verbs.RC && q.typ != verbs.DCI || f.syn != synAck || f.plen != 0 || skip >= q.sent-q.done {
			return // stale, or not sent yet
		}
		for ; skip > 0; skip-- {
			if !ackOnly(w.wr.Op) {
				return // a READ or atomic answers for itself: not ours
			}
			q.complete(w, idx, verbs.Success, uint32(w.wr.Len()))
			idx++
			w = &q.sq[idx%uint64(len(q.sq))]
		}
	}
	switch f.syn {
	case synAck:
		st, n := q.land(w, idx, f, r)
		if st == statusLost {
			return // the retry timer fails it, as a response lost on the wire
		}
		q.complete(w, idx, st, n)
	case synRNR:
		q.backOff(w, idx, time.Duration(f.imm)*time.Microsecond)
	default:
		q.complete(w, idx, synStatus[f.syn], 0)
	}
}

// synStatus maps NAK syndromes to the requester's completion status.
var synStatus = [numSyndromes]verbs.Status{
	synAck: verbs.Success, synRNR: verbs.RNRRetryExcErr, synAccess: verbs.RemAccessErr,
	synInvalid: verbs.RemInvReqErr, synRemoteOp: verbs.RemOpErr,
	synDCKey: verbs.RemAccessErr, synNoDCT: verbs.RemInvReqErr,
}

// synLost is a responder's verdict on a WRITE or SEND cut short by its
// link failing: like a request lost on the wire, it is not answered and
// changes no state (a SEND's receive stays posted; bytes that landed are
// undefined, as a failed operation's are). It is never sent.
const synLost = numSyndromes

// statusLost is land's verdict on a response cut short by its link
// failing: like a response lost on the wire, it completes nothing, and the
// request fails with RETRY_EXC_ERR when its retry timer runs out. It is
// also the verdict on a READ response whose request failed or was flushed
// while its data landed: the request is done already.
const statusLost = verbs.Status(255)

// land places a READ's data or an atomic's original value in the
// requester's SGEs, and returns the status and the bytes the request moved
// (for a WC's ByteLen). w is send queue slot idx; q.mu is held.
func (q *qp) land(w *wqe, idx uint64, f *frame, r io.Reader) (verbs.Status, uint32) {
	switch w.wr.Op {
	case verbs.OpRead:
		if f.plen != uint32(w.wr.Len()) {
			return verbs.BadRespErr, 0
		}
		return q.landRead(w, idx, f, r)
	case verbs.OpCompareSwap, verbs.OpFetchAdd:
		s := w.wr.SGL[0]
		m, b, ok := q.node.acquire(s.LKey, q.pd, s.Addr, 8, verbs.AccessLocalWrite)
		if !ok {
			return verbs.LocProtErr, 0
		}
		binary.LittleEndian.PutUint64(b, f.cmp)
		m.done()
		return verbs.Success, 8
	}
	return verbs.Success, uint32(w.wr.Len()) // a WRITE or SEND the ACK says landed
}

// landRead reads a READ response's payload from r into w's SGEs; w is
// send queue slot idx, and q.mu is held, but not while it reads. A
// response larger than what the link holds lands piecewise as its bytes
// arrive, and its sender may stall in its middle (a peer process stopped,
// or short of CPU): a QP lock held meanwhile would block every PostSend,
// poll and retry timer of the QP, and whatever waits on them, until the
// peer ran again; nor does the MR's use (landPiece) hold its
// Deregister. Unlocked, the request may fail, flush or be reset
// meanwhile, or its MR go; its data has landed then as a failed READ's
// does (undefined), and the response completes nothing (statusLost).
func (q *qp) landRead(w *wqe, idx uint64, f *frame, r io.Reader) (verbs.Status, uint32) {
	var short [4]verbs.SGE
	sgl := append(short[:0], w.wr.SGL...) // the slot may be reused meanwhile
	gen := q.sqGen.Load()
	q.mu.Unlock()
	st := verbs.Success
	for _, s := range sgl {
		m, b, ok := q.node.acquire(s.LKey, q.pd, s.Addr, uint64(s.Length), verbs.AccessLocalWrite)
		if !ok {
			st = verbs.LocProtErr
			break
		}
		err := landPiece(r, m, b)
		m.done()
		if err != nil {
			st = statusLost // the link died in the middle of the response, or the MR went
			break
		}
	}
	q.mu.Lock()
	if q.sqGen.Load() != gen || q.done != idx || q.sent <= idx || q.gen != f.gen || w.psn != f.psn {
		return statusLost, 0
	}
	if st != verbs.Success {
		return st, 0
	}
	return verbs.Success, f.plen
}

// backOff handles an RNR NAK: wait the responder's timer, then go back to
// the NAKed request and resend from there, or fail once retries run out.
func (q *qp) backOff(w *wqe, idx uint64, delay time.Duration) {
	if q.rnrRetry < 7 {
		if q.rnrLeft == 0 {
			q.complete(w, idx, verbs.RNRRetryExcErr, 0)
			return
		}
		q.rnrLeft--
	}
	// An RNR NAK is an answer: the retransmission after the back-off
	// starts the transport timer afresh, as on hardware, so time spent
	// waiting for a receive never counts toward RETRY_EXC_ERR (only
	// rnrRetry bounds it). Kept from the first transmission, the deadline
	// was already past at every retransmission, and the sweep failed the
	// request whenever it ran while one was on the wire. The requests
	// behind it go out again too, and are timed from then.
	for i := idx; i < q.sent; i++ {
		q.sq[i%uint64(len(q.sq))].sentAt = 0
	}
	q.sent = idx
	q.nextPSN = w.psn      // resent from the NAKed request's PSN
	q.halt = verbs.Success // a request that failed its local check is checked again when resent
	q.rnrWait = true
	q.deadline.Store(0)
	if q.rnrTimerT != nil {
		q.rnrTimerT.Stop()
	}
	q.rnrTimerT = time.AfterFunc(delay, func() {
		q.mu.Lock()
		q.rnrWait = false
		q.mu.Unlock()
		q.pump()
	})
}

// framePool recycles response frames.
var framePool = sync.Pool{New: func() any { return new(frame) }}

// serve executes a request on this node, the target, and answers it.
func (n *Node) serve(lk link, f *frame, r io.Reader) {
	q := n.lookupQP(f.dstQPN)
	resp := framePool.Get().(*frame)
	*resp = frame{typ: frameResponse, dstQPN: f.srcQPN, srcQPN: f.dstQPN, psn: f.psn, gen: f.gen, segs: resp.segs[:0], held: resp.held[:0]}
	reply := false
	if q == nil {
		// Hardware drops packets for unknown QPs; a DC request to an
		// unknown DCT number is NAKed so the initiator can refetch.
		if f.flags&flagDC != 0 {
			resp.syn, reply = synNoDCT, true
		}
	} else {
		_, mem := r.(*segReader) // in memory: read at once, under q.mu
		if !mem {
			q.rx.Lock()
		}
		q.mu.Lock()
		reply = q.execute(lk, f, r, resp)
		q.mu.Unlock()
		if !mem {
			q.rx.Unlock()
		}
	}
	if reply {
		lazy := resp.syn == synAck && ackOnly(f.op) && (q.typ == verbs.RC || q.typ == verbs.DCT)
		tl, tcp := lk.(*tcpLink)
		sl, shm := lk.(*shmLink)
		switch {
		case lazy && tcp:
			tl.sendAck(resp)
		case lazy && shm:
			sl.sendAck(resp)
		default:
			lk.send(resp)
		}
	}
	resp.release()
	resp.segs = resp.segs[:0]
	framePool.Put(resp)
}

func (n *Node) lookupQP(num uint32) *qp {
	n.qpMu.RLock()
	q := n.qps[num]
	n.qpMu.RUnlock()
	return q
}

// execute checks and performs one request on target QP q (q.mu held),
// filling resp. It reports whether resp is to be sent: unreliable
// transports never answer, and requests out of sequence are dropped.
func (q *qp) execute(lk link, f *frame, r io.Reader, resp *frame) bool {
	if q.destroyed {
		return false
	}
	switch q.typ {
	case verbs.RC, verbs.UC:
		if (q.state != verbs.StateRTR && q.state != verbs.StateRTS) || q.dest.QPN != f.srcQPN || q.dest.Addr != lk.peer() || f.psn != q.rqPSN {
			return false
		}
	case verbs.DCT:
		if q.state != verbs.StateRTR || f.flags&flagDC == 0 {
			return false
		}
		if f.dckey != q.dcKey {
			resp.syn = synDCKey
			return true
		}
		c, ok := q.dcInSequence(lk.peer(), f)
		if !ok {
			return false
		}
		if resp.syn = q.perform(lk, f, r, resp); resp.syn == synAck {
			c.expect = (c.expect + 1) & psnMask
		}
		return resp.syn != synLost
	case verbs.UD:
		if (q.state != verbs.StateRTR && q.state != verbs.StateRTS) || f.rkey != q.qkey || !f.op.IsSend() {
			return false
		}
	default:
		return false
	}
	resp.syn = q.perform(lk, f, r, resp)
	if resp.syn == synLost {
		return false
	}
	if resp.syn == synAck && (q.typ == verbs.RC || q.typ == verbs.UC) {
		q.rqPSN = (q.rqPSN + 1) & psnMask
	}
	if q.typ == verbs.RC && resp.syn != synAck && resp.syn != synRNR {
		// A class B or C responder error (invalid request, remote access,
		// remote operational) errors the responder's QP too, as the IB
		// spec and rxe do: the requester goes to ERR on the NAK, and an
		// end left in RTS would send its own requests to a QP that no
		// longer answers, each timing out with RETRY_EXC_ERR. Its own
		// requests flush with WR_FLUSH_ERR at once instead.
		q.failLocked(verbs.WRFlushErr, q.done, false)
	}
	return q.typ == verbs.RC || q.typ == verbs.DCT
}

// perform carries out a checked request and returns its syndrome.
func (q *qp) perform(lk link, f *frame, r io.Reader, resp *frame) uint8 {
	if f.op.IsSend() || f.op == verbs.OpWriteImm {
		if f.op == verbs.OpWriteImm {
			if syn := q.remoteWrite(f, r); syn != synAck {
				return syn
			}
		}
		return q.receive(lk, f, r, resp)
	}
	switch f.op {
	case verbs.OpWrite:
		return q.remoteWrite(f, r)
	case verbs.OpRead:
		if q.access&verbs.AccessRemoteRead == 0 {
			return synAccess
		}
		m, b, ok := q.node.acquire(f.rkey, q.pd, f.raddr, uint64(f.rlen), verbs.AccessRemoteRead)
		if !ok {
			return synAccess
		}
		resp.held = append(resp.held, m)
		if len(b) > 0 {
			resp.segs = append(resp.segs, b)
		}
		return synAck
	case verbs.OpCompareSwap, verbs.OpFetchAdd:
		if f.raddr%8 != 0 {
			return synInvalid
		}
		if q.access&verbs.AccessRemoteAtomic == 0 {
			return synAccess
		}
		m, b, ok := q.node.acquire(f.rkey, q.pd, f.raddr, 8, verbs.AccessRemoteAtomic)
		if !ok {
			return synAccess
		}
		resp.cmp = atomic64(b, f)
		m.done()
		return synAck
	}
	return synInvalid
}

// remoteWrite lands a WRITE's payload in the target MR.
func (q *qp) remoteWrite(f *frame, r io.Reader) uint8 {
	if q.access&verbs.AccessRemoteWrite == 0 {
		return synAccess
	}
	if f.plen == 0 {
		return synAck
	}
	m, b, ok := q.node.acquire(f.rkey, q.pd, f.raddr, uint64(f.plen), verbs.AccessRemoteWrite)
	if !ok {
		return synAccess
	}
	err := q.readPayload(r, m, b)
	m.done()
	if err != nil {
		return synLost // the link died in the middle of the payload, or the QP was cut (errCut)
	}
	return synAck
}

// errCut is readPayload's verdict when the QP went to ERR, was reset or
// was destroyed while it read: the request is lost, as one cut short by
// its link (synLost), and q.cut says what became of the QP.
var errCut = errors.New("soft: QP reset, errored or destroyed during the payload")

// q.cut values.
const (
	cutNone    = iota
	cutFlushed // failLocked: the QP went to ERR, its receives flushed
	cutReset   // resetQueues: reset or destroyed, its receives dropped
)

// readPayload reads len(b) bytes of a request's payload from r into b, a
// piece of m that the caller acquired; q.mu is held. From a link's stream
// (a payloadStream) it reads with q.mu released (serve holds q.rx) and m
// held only while bytes land (readHeld): a payload lands as its bytes
// arrive, and its sender may stall in its middle (a peer process stopped,
// or short of CPU), which must not block the QP's posts, polls, Modify
// and Destroy, the node's retry sweep (expire), nor m's Deregister, until
// the peer runs again. The responder's state it checked stays valid
// unless the QP went to ERR, was reset or was destroyed meanwhile: then
// it fails with errCut, answers nothing and changes nothing, and the
// bytes that landed are undefined, as a failed WRITE's are on hardware;
// the requester's retry timer or flush ends the request. So it fails,
// with errMRGone, once m is deregistered, landing nothing after. A
// completion is never reported before the whole payload landed.
func (q *qp) readPayload(r io.Reader, m *mr, b []byte) error {
	q.cut = cutNone
	s, stream := r.(payloadStream)
	if !stream {
		_, err := io.ReadFull(r, b)
		return err
	}
	q.mu.Unlock()
	err := readHeld(s, m, b)
	q.mu.Lock()
	if q.cut != cutNone {
		return errCut
	}
	return err
}

// landPiece reads b, memory of m held by the caller, from r: from a
// link's stream by readHeld, so that m's Deregister does not wait for a
// stalled sender.
func landPiece(r io.Reader, m *mr, b []byte) error {
	if s, stream := r.(payloadStream); stream {
		return readHeld(s, m, b)
	}
	_, err := io.ReadFull(r, b)
	return err
}

// payloadStream is a link's stream a payload is read from, whose sender
// may stall: ready waits, reading nothing, until the next Read returns a
// byte at least without waiting (or fails).
type payloadStream interface {
	io.Reader
	ready() error
}

// errMRGone is readHeld's verdict when the MR it reads into was
// deregistered meanwhile: the request is lost, as one cut short by its
// link.
var errMRGone = errors.New("soft: MR deregistered during the payload")

// readHeld reads b, memory of m held by the caller, from s, letting m go
// while it waits for the next bytes, so that m's Deregister (which waits
// for its users) never waits for a stalled sender. It returns with m held
// again, whatever the outcome.
func readHeld(s payloadStream, m *mr, b []byte) error {
	for len(b) > 0 {
		m.done()
		err := s.ready()
		if !m.hold() {
			return errMRGone
		}
		if err != nil {
			return err
		}
		n, err := s.Read(b)
		b = b[n:]
		if err != nil {
			return err
		}
	}
	return nil
}

// receive consumes a posted receive for a SEND or WRITE_WITH_IMM and
// completes it on the receive CQ.
func (q *qp) receive(lk link, f *frame, r io.Reader, resp *frame) uint8 {
	var sglBuf [4]verbs.SGE
	id, sgl, ok := q.takeRecv(sglBuf[:0])
	if !ok {
		resp.imm = uint32(q.rnrTimer / time.Microsecond)
		return synRNR
	}
	wc := verbs.WC{ID: id, QPN: q.num, Op: verbs.WCRecv, ByteLen: f.plen, Imm: f.imm, HasImm: f.flags&flagImm != 0}
	st, syn := verbs.Success, uint8(synAck)
	if f.op == verbs.OpWriteImm {
		wc.Op = verbs.WCRecvWriteImm
	} else {
		st, syn = q.scatterRecv(sgl, f, r, &wc)
		switch {
		case syn != synLost:
		case q.cut == cutReset:
			return synLost // dropped with the QP's other receives
		case q.cut == cutFlushed:
			// Flushed with the others: it was taken, not posted, when
			// the QP went to ERR.
			q.rcq.push(cqe{wc: verbs.WC{ID: id, Status: verbs.WRFlushErr, Op: verbs.WCRecv, QPN: q.num}})
			return synLost
		case q.untakeRecv(id, sgl):
			return synLost
		default:
			syn = synRemoteOp
		}
	}
	wc.Status = st
	if st != verbs.Success {
		wc.Op = 0
	}
	q.rcq.push(cqe{wc: wc})
	switch l := lk.(type) {
	case *tcpLink:
		q.rcq.setLink(l)
	case *shmLink:
		q.rcq.setShm(l)
	}
	if st != verbs.Success && q.typ != verbs.UD && q.typ != verbs.DCT {
		q.failLocked(verbs.WRFlushErr, q.done, false)
	}
	return syn
}

// grhLen is the Global Routing Header a UD receive buffer starts with.
const grhLen = 40

// scatterRecv copies a SEND's payload into a receive's SGEs.
func (q *qp) scatterRecv(sgl []verbs.SGE, f *frame, r io.Reader, wc *verbs.WC) (verbs.Status, uint8) {
	skip := 0
	if q.typ == verbs.UD {
		skip = grhLen
		wc.ByteLen += grhLen
		wc.SrcQPN = f.srcQPN
	}
	room := 0
	for _, s := range sgl {
		room += int(s.Length)
	}
	if room < int(f.plen)+skip {
		return verbs.LocLenErr, synInvalid
	}
	left := int(f.plen) + skip
	for _, s := range sgl {
		k := min(int(s.Length), left)
		if k == 0 {
			break
		}
		m, b, ok := q.node.acquire(s.LKey, q.pd, s.Addr, uint64(k), verbs.AccessLocalWrite)
		if !ok {
			return verbs.LocProtErr, synRemoteOp
		}
		g := min(skip, k)
		clear(b[:g])
		skip -= g
		err := q.readPayload(r, m, b[g:])
		m.done()
		if err != nil {
			return verbs.LocLenErr, synLost // the link died in the middle of the payload, or the QP was cut (errCut)
		}
		left -= k
	}
	return verbs.Success, synAck
}

// atomic64 performs CAS or FAA on 8 aligned bytes of registered memory.
// Values are native (little-endian) uint64s.
func atomic64(b []byte, f *frame) uint64 {
	p := (*uint64)(unsafe.Pointer(unsafe.SliceData(b)))
	if f.op == verbs.OpFetchAdd {
		return atomic.AddUint64(p, f.cmp) - f.cmp
	}
	for {
		old := atomic.LoadUint64(p)
		if old != f.cmp || atomic.CompareAndSwapUint64(p, old, f.swap) {
			return old
		}
	}
}
