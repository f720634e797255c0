//go:build linux && cgo && rdma

package ibverbs

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// The device sees internal work-request IDs. The top two bits say which
// queue a completion belongs to; the rest name the slot (see sqEntry and
// slotTable), so Poll can return the caller's ID and free the slot.
const (
	kindShift = 62
	kindMask  = uint64(3) << kindShift
	kindSend  = uint64(0) << kindShift
	kindRecv  = uint64(1) << kindShift
	kindSRQ   = uint64(2) << kindShift
)

// Defaults for attributes left zero.
const (
	defaultTimeoutCode = 14 // 4.096 us << 14 = 67 ms per try
	defaultRNRCode     = 12 // 0.64 ms
	maxRdAtomic        = 16 // outstanding READs/atomics per QP, either way
	defaultQueueDepth  = 64
	rxeVendorID        = 0xffffff // rdma_rxe's vendor_id (RXE_VENDOR_ID)
)

// sqEntry remembers a posted send WR until a completion frees its slot.
type sqEntry struct {
	seq uint64
	id  uint64
	op  verbs.Opcode
}

// qp is an RC, UC or UD queue pair.
type qp struct {
	d      *device
	p      *pd
	c      *cQP
	num    uint32
	typ    verbs.QPType
	scq    *cq
	rcq    *cq
	srq    *srq
	cap    verbs.QPCap // the limits Go enforces: what the caller asked for
	sigAll bool

	mu      sync.Mutex // guards everything below and the C scratch
	closed  bool
	state   verbs.QPState // as last set or queried
	psn     uint32
	sq      []sqEntry // ring indexed by seq % len
	head    uint64    // oldest seq whose slot is held
	tail    uint64    // next seq to post
	rq      *slotTable
	scratch *postScratch
}

// CreateQP creates an RC, UC or UD QP in RESET. DCI and DCT need mlx5dv,
// which this binding does not use: they fail with ErrUnsupported.
func (p *pd) CreateQP(init verbs.QPInit) (verbs.QP, error) {
	if err := p.d.own("CreateQP"); err != nil {
		return nil, err
	}
	defer p.d.mu.Unlock()
	if err := p.live("CreateQP"); err != nil {
		return nil, err
	}
	var typ int
	switch init.Type {
	case verbs.RC:
		typ = qptRC
	case verbs.UC:
		typ = qptUC
	case verbs.UD:
		typ = qptUD
	case verbs.DCI, verbs.DCT:
		return nil, fmt.Errorf("ibverbs: CreateQP(%s): DC needs mlx5dv, which this provider does not use: %w", init.Type, verbs.ErrUnsupported)
	default:
		return nil, fmt.Errorf("ibverbs: CreateQP: unknown type %s: %w", init.Type, verbs.ErrInvalid)
	}
	scq, ok1 := init.SendCQ.(*cq)
	rcq, ok2 := init.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq.d != p.d || rcq.d != p.d {
		return nil, fmt.Errorf("ibverbs: CreateQP: send and receive CQs must be CQs of device %s: %w", p.d.name, verbs.ErrInvalid)
	}
	var s *srq
	if init.SRQ != nil {
		var ok bool
		if s, ok = init.SRQ.(*srq); !ok || s.p.d != p.d {
			return nil, fmt.Errorf("ibverbs: CreateQP: SRQ of another device or provider: %w", verbs.ErrInvalid)
		}
	}
	for _, c := range []*cq{scq, rcq} {
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return nil, fmt.Errorf("ibverbs: CreateQP on a closed CQ: %w", verbs.ErrClosed)
		}
	}
	c, err := p.d.qpCap(init.Cap, s != nil)
	if err != nil {
		return nil, fmt.Errorf("ibverbs: CreateQP(%s): %w", init.Type, err)
	}
	var cs *cSRQ
	if s != nil {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return nil, fmt.Errorf("ibverbs: CreateQP on a closed SRQ: %w", verbs.ErrClosed)
		}
		cs = s.c
	}
	recvWR := c.MaxRecvWR
	if s != nil {
		recvWR = 0
	}
	cqp, num, _, err := createQP(p.c, typ, scq.c, rcq.c, cs, qpCaps{
		sendWR: c.MaxSendWR, recvWR: recvWR, sendSGE: c.MaxSendSGE, recvSGE: c.MaxRecvSGE, inline: c.MaxInline,
	}, init.SignalAll)
	if err != nil {
		return nil, fmt.Errorf("ibverbs: CreateQP(%s, %+v): %w", init.Type, c, err)
	}
	q := &qp{
		d: p.d, p: p, c: cqp, num: num, typ: init.Type, scq: scq, rcq: rcq, srq: s, cap: c,
		sigAll: init.SignalAll, state: verbs.StateReset, psn: newPSN(),
		sq: make([]sqEntry, c.MaxSendWR), rq: newSlotTable(c.MaxRecvWR),
		scratch: newPostScratch(max(c.MaxSendSGE, c.MaxRecvSGE)),
	}
	p.d.qps[num] = q
	p.nqp++
	scq.addUser(1)
	rcq.addUser(1)
	if s != nil {
		s.addUser(1)
	}
	return q, nil
}

// qpCap fills zero fields with defaults and checks the device's limits.
func (d *device) qpCap(c verbs.QPCap, withSRQ bool) (verbs.QPCap, error) {
	at := d.info.attr
	def := func(v, dflt int) int {
		if v == 0 {
			return dflt
		}
		return v
	}
	c.MaxSendWR = def(c.MaxSendWR, min(defaultQueueDepth, at.MaxQPWR))
	c.MaxRecvWR = def(c.MaxRecvWR, min(defaultQueueDepth, at.MaxQPWR))
	c.MaxSendSGE = def(c.MaxSendSGE, 1)
	c.MaxRecvSGE = def(c.MaxRecvSGE, 1)
	if withSRQ {
		c.MaxRecvWR = 0
	}
	switch {
	case c.MaxSendWR < 0 || c.MaxRecvWR < 0 || c.MaxSendSGE < 0 || c.MaxRecvSGE < 0 || c.MaxInline < 0:
		return c, fmt.Errorf("negative capacity %+v: %w", c, verbs.ErrInvalid)
	case c.MaxSendWR > at.MaxQPWR || c.MaxRecvWR > at.MaxQPWR:
		return c, fmt.Errorf("queue depth %d/%d exceeds the device's %d: %w", c.MaxSendWR, c.MaxRecvWR, at.MaxQPWR, verbs.ErrLimit)
	case c.MaxSendSGE > at.MaxSGE || c.MaxRecvSGE > at.MaxSGE:
		return c, fmt.Errorf("%d/%d SGEs exceed the device's %d: %w", c.MaxSendSGE, c.MaxRecvSGE, at.MaxSGE, verbs.ErrLimit)
	case c.MaxInline > at.MaxInline:
		return c, fmt.Errorf("inline %d exceeds the device's %d: %w", c.MaxInline, at.MaxInline, verbs.ErrLimit)
	}
	return c, nil
}

// newPSN picks a random 24-bit starting PSN, as rdma_cm does, so a stale
// packet of an earlier connection is unlikely to be in sequence.
func newPSN() uint32 { return rand.Uint32() & 0xffffff }

// name names the QP in errors.
func (q *qp) name() string { return fmt.Sprintf("%s QP %d", q.typ, q.num) }

// Num is the QP number.
func (q *qp) Num() uint32 { return q.num }

// Type is the transport.
func (q *qp) Type() verbs.QPType { return q.typ }

// State is the QP's state. Once the QP has been connected the device may
// move it to ERR on its own, so the device is asked.
func (q *qp) State() verbs.QPState {
	if err := q.d.use("State"); err != nil {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.state
	}
	defer q.d.mu.RUnlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.refreshLocked()
}

// refreshLocked updates the cached state from the device where the device
// may have changed it.
func (q *qp) refreshLocked() verbs.QPState {
	if q.closed {
		return q.state
	}
	switch q.state {
	case verbs.StateRTR, verbs.StateRTS, verbs.StateSQD, verbs.StateSQE:
		if st, err := queryQPState(q.c); err == nil {
			q.state = st
		}
	}
	return q.state
}

// Endpoint is what a peer needs to connect to this QP.
func (q *qp) Endpoint() verbs.Endpoint {
	q.mu.Lock()
	psn := q.psn
	q.mu.Unlock()
	port := q.d.info.port
	return verbs.Endpoint{GID: port.GID, LID: port.LID, QPN: q.num, PSN: psn}
}

// Modify applies a state transition: verbs.CheckTransition decides
// whether it is legal and which attributes it applies, and attrFor turns
// those into the ibv_modify_qp mask the kernel checks against the same
// table (ib_modify_qp_is_ok).
func (q *qp) Modify(a verbs.QPAttr) error {
	if err := q.d.use("Modify"); err != nil {
		return err
	}
	defer q.d.mu.RUnlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("ibverbs: Modify %s QP %d: %w", q.typ, q.num, verbs.ErrClosed)
	}
	from := q.refreshLocked()
	mask, err := verbs.CheckTransition(q.typ, from, a)
	if err != nil {
		return fmt.Errorf("ibverbs: QP %d: %w", q.num, err)
	}
	m, err := q.attrFor(mask, a)
	if err != nil {
		return fmt.Errorf("ibverbs: %s QP %d: %s -> %s: %w", q.typ, q.num, from, a.State, err)
	}
	if from == verbs.StateReset && a.State == verbs.StateErr {
		// Verbs allows any state -> ERR, but the kernel's transition table
		// (ib_modify_qp_is_ok) has no RESET -> ERR: pass through INIT.
		toInit := verbs.QPAttr{State: verbs.StateInit}
		initMask, _ := verbs.CheckTransition(q.typ, from, toInit)
		init, _ := q.attrFor(initMask, toInit)
		if err := modifyQP(q.c, init); err != nil {
			return fmt.Errorf("ibverbs: %s QP %d: RESET -> INIT on the way to ERR: %w", q.typ, q.num, err)
		}
		q.state = verbs.StateInit
	}
	if err := modifyQP(q.c, m); err != nil {
		return fmt.Errorf("ibverbs: %s QP %d: %s -> %s: %w", q.typ, q.num, from, a.State, err)
	}
	q.state = a.State
	if a.State == verbs.StateReset {
		// The device emptied both queues: every slot is free again, and a
		// new PSN keeps the next connection apart from the last.
		q.head = q.tail
		q.rq.reset()
		q.psn = newPSN()
	}
	return nil
}

// attrFor builds the ibv_modify_qp attributes and mask for the verbs
// attributes mask of a step to a.State.
func (q *qp) attrFor(mask verbs.QPAttrMask, a verbs.QPAttr) (modifyAttr, error) {
	d := q.d
	m := modifyAttr{mask: maskState, state: int(a.State), port: d.portNum}
	if mask&verbs.AttrPort != 0 {
		m.mask |= maskPKey | maskPort
	}
	if mask&verbs.AttrQKey != 0 {
		m.mask |= maskQKey
		m.qkey = a.QKey
	}
	if mask&verbs.AttrAccess != 0 {
		m.mask |= maskAccess
		m.access = int(a.Access)
		if q.typ == verbs.UC {
			// UC has no READs or atomics to allow.
			m.access = int(a.Access & (verbs.AccessLocalWrite | verbs.AccessRemoteWrite))
		}
	}
	if mask&verbs.AttrDest != 0 {
		global, err := d.needGRH(a.Dest)
		if err != nil {
			return m, err
		}
		m.mask |= maskAV | maskDestQPN | maskRQPSN
		m.global, m.dgid, m.sgidIndex, m.dlid = global, a.Dest.GID, d.gidIdx, a.Dest.LID
		m.destQPN, m.rqPSN = a.Dest.QPN, a.Dest.PSN&0xffffff
	}
	if mask&verbs.AttrPathMTU != 0 {
		mtu := d.info.port.MTU
		if a.MTU > 0 {
			mtu = min(a.MTU, mtu)
		}
		m.mask |= maskPathMTU
		m.mtu = mtuEnum(mtu)
	}
	if mask&verbs.AttrDestRdAtomic != 0 {
		m.mask |= maskMaxDestRd
		m.maxDestRdAtomic = max(1, min(maxRdAtomic, d.info.maxRdAtomic))
	}
	if mask&verbs.AttrMinRNRTimer != 0 {
		m.mask |= maskMinRNRTimer
		m.minRNRTimer = rnrCode(a.MinRNRTimer)
	}
	if mask&verbs.AttrSQPSN != 0 {
		m.mask |= maskSQPSN
		m.sqPSN = a.SQPSN & 0xffffff
	}
	q.rtsAttrs(&m, mask, a)
	return m, nil
}

// rtsAttrs adds an RC requester's retry attributes and READ depth.
func (q *qp) rtsAttrs(m *modifyAttr, mask verbs.QPAttrMask, a verbs.QPAttr) {
	d := q.d
	if mask&verbs.AttrTimeout != 0 {
		m.mask |= maskTimeout
		m.timeout = timeoutCode(a.Timeout)
	}
	if mask&verbs.AttrRetryCount != 0 {
		m.mask |= maskRetryCnt
		m.retryCnt = a.RetryCount
		if d.info.vendorID == rxeVendorID && m.retryCnt == 7 {
			// rxe reads retry_cnt 7 as "retry forever" (IB gives that
			// meaning only to rnr_retry), so a dead peer would never
			// fail: 6 keeps the failure bounded.
			m.retryCnt = 6
		}
	}
	if mask&verbs.AttrRNRRetry != 0 {
		m.mask |= maskRNRRetry
		m.rnrRetry = a.RNRRetry
	}
	if mask&verbs.AttrRdAtomic != 0 {
		m.mask |= maskMaxRdAtomic
		m.maxRdAtomic = max(1, min(maxRdAtomic, d.info.maxInitAtom))
	}
}

// timeoutCode converts an ACK timeout to IB's 4.096 us * 2^code encoding:
// the smallest code at least d long.
func timeoutCode(d time.Duration) int {
	if d <= 0 {
		return defaultTimeoutCode
	}
	for c := 1; c < 31; c++ {
		if time.Duration(4096)<<c >= d {
			return c
		}
	}
	return 31
}

// rnrTimes are the IB RNR NAK timer codes 1..31 in units of 10 us; code 0
// is the longest, 655.36 ms.
var rnrTimes = [...]int{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
	1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152}

// rnrCode converts a receiver-not-ready back-off to the smallest code at
// least d long.
func rnrCode(d time.Duration) int {
	if d <= 0 {
		return defaultRNRCode
	}
	for i, t := range rnrTimes {
		if time.Duration(t)*10*time.Microsecond >= d {
			return i + 1
		}
	}
	return 0
}

// ibvOpcode maps a verbs opcode to ibv_wr_opcode.
func ibvOpcode(o verbs.Opcode) int {
	switch o {
	case verbs.OpSend:
		return wrSend
	case verbs.OpSendImm:
		return wrSendImm
	case verbs.OpWrite:
		return wrWrite
	case verbs.OpWriteImm:
		return wrWriteImm
	case verbs.OpRead:
		return wrRead
	case verbs.OpCompareSwap:
		return wrCAS
	case verbs.OpFetchAdd:
		return wrFAA
	}
	return -1
}

// PostSend checks each WR (state, opcode for the transport, SGE count,
// inline size, atomic shape, queue room) and posts the accepted ones in
// batches of postBatch per cgo call. On error wrs[n] is the refused WR.
func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	if err := q.d.use("PostSend"); err != nil {
		return 0, err
	}
	defer q.d.mu.RUnlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, fmt.Errorf("ibverbs: PostSend on %s QP %d: %w", q.typ, q.num, verbs.ErrClosed)
	}
	switch q.state {
	case verbs.StateRTS, verbs.StateSQD, verbs.StateSQE, verbs.StateErr:
		// In ERR the device flushes what is posted, as hardware does.
	default:
		return 0, fmt.Errorf("ibverbs: PostSend on %s QP %d in %s: %w", q.typ, q.num, q.state, verbs.ErrQPState)
	}
	done := 0
	for done < len(wrs) {
		n, err := q.postSendBatch(wrs[done:min(len(wrs), done+postBatch)])
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// postSendBatch prepares up to postBatch WRs in the C scratch and posts
// them with one call. WRs before a refused one are still posted.
func (q *qp) postSendBatch(wrs []verbs.SendWR) (int, error) {
	cw, sgl := q.scratch.swrs(), q.scratch.sgl()
	n, off := 0, 0
	var refused error
	for i := range wrs {
		wr := &wrs[i]
		ah, err := q.checkSend(wr)
		if err == nil && q.tail-q.head >= uint64(len(q.sq)) {
			err = fmt.Errorf("send queue of %d WRs is full: %w", len(q.sq), verbs.ErrQueueFull)
		}
		if err != nil {
			refused = fmt.Errorf("ibverbs: PostSend WR %d (%s) on %s QP %d: %w", wr.ID, wr.Op, q.typ, q.num, err)
			break
		}
		for j, g := range wr.SGL {
			setSGE(&sgl[off+j], g)
		}
		flags := 0
		if wr.Flags&verbs.Signaled != 0 {
			flags |= sendSignaled
		}
		if wr.Flags&verbs.Inline != 0 {
			flags |= sendInline
		}
		if wr.Flags&verbs.Fence != 0 {
			flags |= sendFence
		}
		if wr.Flags&verbs.Solicited != 0 {
			flags |= sendSolicited
		}
		seq := q.tail
		q.sq[seq%uint64(len(q.sq))] = sqEntry{seq: seq, id: wr.ID, op: wr.Op}
		q.tail++
		setSWR(&cw[n], kindSend|seq, ibvOpcode(wr.Op), flags, wr, ah, len(wr.SGL), off)
		off += len(wr.SGL)
		n++
	}
	if n == 0 {
		return 0, refused
	}
	k, err := postSend(q.c, q.scratch, n)
	if err != nil {
		q.tail -= uint64(n - k) // the refused ones hold no slot
		return k, fmt.Errorf("ibverbs: PostSend on %s QP %d: %w", q.typ, q.num, err)
	}
	return k, refused
}

// checkSend validates one send WR against the QP; it returns the C address
// handle of a UD send.
func (q *qp) checkSend(wr *verbs.SendWR) (*cAH, error) {
	if !wr.Op.Valid() || !q.typ.Supports(wr.Op) {
		return nil, fmt.Errorf("opcode %s on %s: %w", wr.Op, q.typ, verbs.ErrInvalid)
	}
	if len(wr.SGL) > q.cap.MaxSendSGE {
		return nil, fmt.Errorf("%d SGEs, QP allows %d: %w", len(wr.SGL), q.cap.MaxSendSGE, verbs.ErrLimit)
	}
	n := wr.Len()
	if uint64(n) > uint64(q.d.info.attr.MaxMsgSize) {
		return nil, fmt.Errorf("%d bytes, device allows %d per message: %w", n, q.d.info.attr.MaxMsgSize, verbs.ErrLimit)
	}
	if wr.Flags&verbs.Inline != 0 {
		if n > q.cap.MaxInline {
			return nil, fmt.Errorf("%d inline bytes, QP allows %d: %w", n, q.cap.MaxInline, verbs.ErrLimit)
		}
		// libibverbs copies inline data from the SGE address with the CPU:
		// an address outside live off-heap memory would crash the process.
		for _, g := range wr.SGL {
			if _, err := offheap.Slice(g.Addr, int(g.Length)); err != nil {
				return nil, fmt.Errorf("inline SGE at %#x+%d: %w (%w)", g.Addr, g.Length, verbs.ErrInvalid, err)
			}
		}
	}
	if wr.Op.IsAtomic() && (len(wr.SGL) != 1 || wr.SGL[0].Length != 8) {
		return nil, fmt.Errorf("atomic needs one 8-byte SGE for the original value: %w", verbs.ErrInvalid)
	}
	if q.typ != verbs.UD {
		return nil, nil
	}
	a, ok := wr.AH.(*ah)
	if !ok || a.p.d != q.d {
		return nil, fmt.Errorf("UD send needs an address handle of device %s: %w", q.d.name, verbs.ErrInvalid)
	}
	if a.closed {
		return nil, fmt.Errorf("UD send on a closed address handle: %w", verbs.ErrClosed)
	}
	return a.c, nil
}

// PostRecv queues receive buffers on the QP's own receive queue.
func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if err := q.d.use("PostRecv"); err != nil {
		return 0, err
	}
	defer q.d.mu.RUnlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return 0, fmt.Errorf("ibverbs: PostRecv on %s QP %d: %w", q.typ, q.num, verbs.ErrClosed)
	case q.srq != nil:
		return 0, fmt.Errorf("ibverbs: PostRecv on %s QP %d, which receives from an SRQ: %w", q.typ, q.num, verbs.ErrInvalid)
	case q.state == verbs.StateReset:
		return 0, fmt.Errorf("ibverbs: PostRecv on %s QP %d in RESET: %w", q.typ, q.num, verbs.ErrQPState)
	}
	n, err := postRecvs(wrs, q.rq, q.cap.MaxRecvSGE, kindRecv, q.scratch, func(n int) (int, error) {
		return postRecv(q.c, nil, q.scratch, n)
	}, q.name)
	if n > 0 && q.state == verbs.StateErr {
		// Receives posted in ERR must flush. Some devices (rxe) take
		// receives without a doorbell and flush only when the responder
		// next runs: ERR -> ERR is legal and makes it run now.
		if kerr := modifyQP(q.c, modifyAttr{mask: maskState, state: int(verbs.StateErr)}); kerr != nil && err == nil {
			err = fmt.Errorf("ibverbs: PostRecv on %s QP %d in ERR: flush: %w", q.typ, q.num, kerr)
		}
	}
	return n, err
}

// postRecvs is PostRecv for a QP or an SRQ: check, take a slot, fill the C
// scratch, post in batches.
// who names the queue in errors; it is a func so the fast path formats
// nothing.
func postRecvs(wrs []verbs.RecvWR, slots *slotTable, maxSGE int, kind uint64, s *postScratch, post func(int) (int, error), who func() string) (int, error) {
	done := 0
	for done < len(wrs) {
		cw, sgl := s.rwrsGo(), s.sgl()
		batch := wrs[done:min(len(wrs), done+postBatch)]
		n, off := 0, 0
		var refused error
		keys := [postBatch]uint64{}
		for i := range batch {
			wr := &batch[i]
			if len(wr.SGL) > maxSGE {
				refused = fmt.Errorf("ibverbs: PostRecv WR %d on %s: %d SGEs, queue allows %d: %w", wr.ID, who(), len(wr.SGL), maxSGE, verbs.ErrLimit)
				break
			}
			if slots.avail() == 0 {
				refused = fmt.Errorf("ibverbs: PostRecv WR %d on %s: receive queue of %d is full: %w", wr.ID, who(), slots.size(), verbs.ErrQueueFull)
				break
			}
			for j, g := range wr.SGL {
				setSGE(&sgl[off+j], g)
			}
			keys[n] = slots.alloc(wr.ID)
			setRWR(&cw[n], kind|keys[n], len(wr.SGL), off)
			off += len(wr.SGL)
			n++
		}
		if n > 0 {
			k, err := post(n)
			for _, key := range keys[k:n] {
				slots.release(key) // refused by the device: no slot held
			}
			done += k
			if err != nil {
				return done, fmt.Errorf("ibverbs: PostRecv on %s: %w", who(), err)
			}
		}
		if refused != nil {
			return done, refused
		}
	}
	return done, nil
}

// complete routes a completion of this QP: it restores the caller's ID and
// frees the queue slots the completion retires. Called by Poll with the
// device lock shared and the CQ's lock held.
func (q *qp) complete(wc *verbs.WC) {
	key := wc.ID &^ kindMask
	switch wc.ID & kindMask {
	case kindSend:
		q.mu.Lock()
		if key >= q.head && key < q.tail {
			e := q.sq[key%uint64(len(q.sq))]
			if e.seq == key {
				wc.ID = e.id
				if wc.Status != verbs.Success {
					// A failed completion's opcode is undefined in
					// verbs; the posted WR says what it was.
					wc.Op = verbs.CompletionOf(e.op)
				}
				// As on mlx5: polling a completion frees its slot and
				// the slots of the unsignaled WRs before it.
				q.head = key + 1
			}
		}
		q.mu.Unlock()
	case kindRecv:
		q.mu.Lock()
		if id, ok := q.rq.release(key); ok {
			wc.ID = id
		}
		q.mu.Unlock()
		if wc.Status != verbs.Success {
			wc.Op = verbs.WCRecv
		}
	case kindSRQ:
		if q.srq != nil {
			q.srq.complete(wc, key)
		}
		if wc.Status != verbs.Success {
			wc.Op = verbs.WCRecv
		}
	}
}

// Close destroys the QP. Completions of its work still in a CQ come back
// with the device's internal IDs.
func (q *qp) Close() error {
	if err := q.d.own("close QP"); err != nil {
		return err
	}
	defer q.d.mu.Unlock()
	if q.closed {
		return fmt.Errorf("ibverbs: close %s QP %d: %w", q.typ, q.num, verbs.ErrClosed)
	}
	delete(q.d.qps, q.num)
	return q.destroyLocked()
}

// destroyLocked frees the QP; the device lock is held exclusively.
func (q *qp) destroyLocked() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	err := destroyQP(q.c)
	q.scratch.free()
	q.p.nqp--
	q.scq.addUser(-1)
	q.rcq.addUser(-1)
	if q.srq != nil {
		q.srq.addUser(-1)
	}
	return err
}

// addUser counts QPs completing into the CQ.
func (c *cq) addUser(n int) {
	c.mu.Lock()
	c.nqp += n
	c.mu.Unlock()
}

// slotTable tracks posted receives: each holds a slot until its completion
// is polled. The device sees generation<<32 | slot, so a completion of an
// earlier use of a slot (a QP reset since) is not mistaken for the current.
type slotTable struct {
	ids  []uint64
	gens []uint32 // generation of the slot's current use; 0 = free
	free []int32
	gen  uint32
}

const genMask = 1<<30 - 1

func newSlotTable(n int) *slotTable {
	s := &slotTable{ids: make([]uint64, n), gens: make([]uint32, n)}
	s.reset()
	return s
}

func (s *slotTable) size() int  { return len(s.ids) }
func (s *slotTable) avail() int { return len(s.free) }

// alloc takes a free slot for id (the caller checked avail) and returns
// the key the device will see.
func (s *slotTable) alloc(id uint64) uint64 {
	i := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.gen = (s.gen + 1) & genMask
	if s.gen == 0 {
		s.gen = 1
	}
	s.ids[i], s.gens[i] = id, s.gen
	return uint64(s.gen)<<32 | uint64(i)
}

// release frees the slot key names and returns its ID, or false for a key
// of an earlier use.
func (s *slotTable) release(key uint64) (uint64, bool) {
	i, g := int(uint32(key)), uint32(key>>32)&genMask
	if i >= len(s.ids) || g == 0 || s.gens[i] != g {
		return 0, false
	}
	s.gens[i] = 0
	s.free = append(s.free, int32(i))
	return s.ids[i], true
}

// reset frees every slot.
func (s *slotTable) reset() {
	s.free = s.free[:0]
	for i := len(s.ids) - 1; i >= 0; i-- {
		s.gens[i] = 0
		s.free = append(s.free, int32(i))
	}
}
