package core

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/krcore/krcore/verbs"
)

// hdrLen is the header the runtime puts before every two-sided message:
// sender node (8), sender port (4), user immediate (4). The sender port's
// top bit (hdrWrite; bound ports never have it) marks the notification of
// a WRITE_WITH_IMM, whose payload is the byte count (notifyLen).
const hdrLen = 16

// hdrWrite flags, in a header's sender port, the notification of a
// WRITE_WITH_IMM.
const hdrWrite = 1 << 31

// notifyLen is the length of a WRITE_WITH_IMM's notification: the header
// and the 4-byte count of bytes written.
const notifyLen = hdrLen + 4

// hdrSlot is the room a header slot of a physical QP holds: the header
// and a message of up to hdrPayload bytes (two cache lines). A message
// that fits is copied behind its header when posted and goes out as one
// scatter-gather entry: the RNIC gathers each entry on its own (on the
// soft RNIC a lookup of its key and four atomic operations, more than
// copying a hundred bytes), and a raw QP's SEND is one entry too.
const hdrSlot = 128

// hdrPayload is the largest message that travels in its header slot.
const hdrPayload = hdrSlot - hdrLen

// rec is one request on a physical QP, kept until it completes so it can be
// reposted if another VQ's request breaks the QP.
type rec struct {
	q        *Queue
	seq      uint64 // the VQ's sequence number
	op       verbs.Opcode
	signaled bool // the user asked for a completion
	target   *target
	local    verbs.SGE
	hasLocal bool
	raddr    uint64
	rkey     uint32
	imm      uint32
	cmp      uint64
	swap     uint64
	dstPort  uint32
	msgImm   bool // a user SEND_WITH_IMM: imm travels in the header
	// src is the local MR of a message of up to hdrPayload bytes, which
	// is copied into the header slot when posted (see hdrSlot); nil for
	// anything else. The request holds the MR until it finishes.
	src *MR
	// notify: a WRITE_WITH_IMM on a VQ connected to a port, posted as a
	// WRITE and, behind it on the same QP, a SEND_WITH_IMM notification
	// to dstPort (see pqp.appendWRs).
	notify bool
}

// wrs is how many work requests r takes in the send queue.
func (r *rec) wrs() int {
	if r.notify {
		return 2
	}
	return 1
}

// pqp is a physical QP shared by many VQs: a DCI of the pool, or an RC QP
// to one peer. Requests are posted in order; wr_id carries the VQ id and
// the physical sequence number, and a completion retires every earlier
// request (unsignaled ones included) because the QP completes in order.
type pqp struct {
	rt *Runtime
	qp verbs.QP
	rc *peer // the peer of an RC QP; nil for a DCI
	// pooled: the RC QP has been in its peer's pool (for PoolQPs, which
	// tells a QP that left it from one not yet in it).
	pooled atomic.Bool
	// remoteQPN is the peer's end of an RC QP.
	remoteQPN uint32
	// tgt is the life of the peer an RC QP is connected to (its target
	// when the QP was made): a node that restarts under the same id has a
	// new target, and the QP reaches nothing of it (see dropStaleRCs).
	tgt *target
	// built: this node built the RC QP (buildRC) rather than accepted it;
	// only the builder evicts it, and only when both ends are idle (see
	// evictIdle).
	built bool
	// sqPSN is the PSN the DCI's send queue last started at (repair picks
	// a new one each time it makes the DCI ready again).
	sqPSN uint32
	depth int
	// mask maps a physical sequence number to its slot in recs and hdr,
	// whose size is depth rounded up to a power of two (ringSize): a
	// mask, not a division, on the path of every request.
	mask uint64
	hdr  *MR // a header slot (hdrSlot bytes) per slot, for two-sided messages

	mu   sync.Mutex
	recs []rec // in flight, a ring indexed by slot
	// off shifts sequence numbers to slots (see slot). It changes only
	// when nothing is in flight (p.n == 0), to make the next request's
	// slot 0: a QP whose requests are awaited one at a time then reuses
	// the first record and header slot, lines in cache, instead of
	// walking both rings (~40 KB at the default depth).
	off         uint64
	base        uint64
	n           int
	used        int    // send queue entries the n records take (rec.wrs)
	next        uint64 // sequence number of the next post
	backlog     []rec  // waiting for a free slot or for recovery
	sinceSignal int
	broken      bool // recovering: everything waits in the backlog
	dead        bool
	destroyed   bool
	// An evicted RC QP closes when both ends have drained.
	localDrained, remoteDrained bool
	wrs                         []verbs.SendWR // scratch for posting
	sges                        []verbs.SGE    // scratch SGEs, two per record at most
	// opsPeer's requests posted here and not yet added to its count
	// (peer.ops): counted under mu, which posting holds anyway, and added
	// with one atomic when the QP posts for another peer or the pool
	// manager samples the loads (flushOps), instead of one per request.
	opsPeer *peer
	opsN    uint64
}

func newPQP(rt *Runtime, qp verbs.QP, depth int, rc *peer) (*pqp, error) {
	ring := ringSize(depth)
	hdr, err := rt.RegMR(ring*hdrSlot, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	return &pqp{rt: rt, qp: qp, rc: rc, sqPSN: qp.Endpoint().PSN, depth: depth, mask: uint64(ring - 1), hdr: hdr, recs: make([]rec, ring),
		wrs: make([]verbs.SendWR, 0, depth), sges: make([]verbs.SGE, 0, 2*depth)}, nil
}

// ringSize is the power of two a QP of depth requests keeps its records in.
func ringSize(depth int) int {
	n := 1
	for n < depth {
		n <<= 1
	}
	return n
}

// slot is the index in recs (and hdr) of physical sequence number seq;
// p.mu held.
func (p *pqp) slot(seq uint64) int { return int((seq + p.off) & p.mask) }

// emptied makes the next request take slot 0 if nothing is in flight
// (see off); p.mu held.
func (p *pqp) emptied() {
	if p.n == 0 {
		p.off = -p.base
	}
}

// postsNow reports whether a request may be posted at once: the QP is
// neither dead nor broken and nothing is backlogged before it; p.mu held.
func (p *pqp) postsNow() bool { return !p.dead && !p.broken && len(p.backlog) == 0 }

// room reports whether the ring and the send queue have room for one more
// record, of up to 2 work requests (rec.wrs); p.mu held.
func (p *pqp) room() bool { return p.n < p.depth && p.used+2 <= p.depth }

// post queues records and posts what fits in the send queue. It returns
// the records it could not take because the QP is gone for good; the
// caller fails them (it may hold their VQ's lock, which post never takes).
func (p *pqp) post(rs []rec) []rec {
	p.mu.Lock()
	if p.dead && p.rc != nil && len(rs) > 0 {
		// An RC QP evicted while a VQ was choosing it: DC still works, or
		// in RC-only mode another RC QP to the peer, if there is one (else
		// the caller holds the records until there is).
		p.mu.Unlock()
		q := rs[0].q
		if to := p.rc.routeFor(q); to != nil && to != p {
			return to.post(rs)
		}
		if d := p.rt.dciFor(q); d != nil {
			return d.post(rs) // the peer still lists p: its removal is on its way
		}
		return rs
	}
	if p.postsNow() {
		// Nothing waits before rs: post them straight from rs.
		if k := p.postRecs(rs); k < len(rs) {
			p.backlog = append(p.backlog, rs[k:]...)
		}
		p.mu.Unlock()
		return nil
	}
	p.backlog = append(p.backlog, rs...)
	lost := p.drainLocked()
	p.mu.Unlock()
	return lost
}

// drainLocked posts backlog records while the send queue has room. It
// returns records it could not post because the QP is gone.
func (p *pqp) drainLocked() []rec {
	if p.dead {
		lost := p.backlog
		p.backlog = nil
		return lost
	}
	if p.broken || len(p.backlog) == 0 {
		return nil
	}
	if k := p.postRecs(p.backlog); k > 0 {
		p.backlog = append(p.backlog[:0], p.backlog[k:]...)
	}
	return nil
}

// postRecs posts the records of rs that fit in the send queue, in order,
// and returns how many it posted; p.mu held, p neither dead nor broken.
func (p *pqp) postRecs(rs []rec) int {
	k, used := 0, p.used
	for k < len(rs) && p.n+k < p.depth && used+rs[k].wrs() <= p.depth {
		used += rs[k].wrs()
		k++
	}
	if k == 0 {
		return 0
	}
	p.wrs, p.sges = p.wrs[:0], p.sges[:0]
	for i := 0; i < k; i++ {
		seq := p.next
		p.next++
		r := &p.recs[p.slot(seq)]
		*r = rs[i]
		p.n++
		p.countOps(r.target.peer, 1)
		p.wrs = p.appendWRs(p.wrs, r, seq, i == k-1)
	}
	p.used = used
	p.postWRs()
	return k
}

// postWRs posts the work requests built in p.wrs; p.mu held.
func (p *pqp) postWRs() {
	if _, err := p.qp.PostSend(p.wrs); err != nil {
		// The QP refused (it broke meanwhile); the records stay in flight
		// and complete through recovery when the error completion arrives.
		p.rt.count(&p.rt.stats.postErrors)
		p.rt.log.Debug("post refused", "qpn", p.qp.Num(), "err", err)
	}
}

// countOps counts n requests posted for peer; p.mu held.
func (p *pqp) countOps(peer *peer, n int) {
	if peer != p.opsPeer {
		p.flushOpsLocked()
		p.opsPeer = peer
	}
	p.opsN += uint64(n)
}

// flushOps adds the requests counted and not yet added to their peer's
// count, so that a sample of peer.ops sees every request posted before.
func (p *pqp) flushOps() {
	p.mu.Lock()
	p.flushOpsLocked()
	p.mu.Unlock()
}

func (p *pqp) flushOpsLocked() {
	if p.opsN > 0 {
		p.opsPeer.ops.Add(p.opsN)
		p.opsN = 0
	}
}

// appendWRs appends the work requests for record r at physical sequence
// seq. The last request of every posting is signaled, whatever its VQ
// asked: an unsignaled request completes only when a later signaled one
// does, and nothing may follow it (the VQ may be waiting to switch
// routes).
//
// A notifying WRITE_WITH_IMM is two work requests under one wr_id: the
// WRITE, never signaled, and its notification, signaled as the record
// asks. The QP executes them in order to one target (RC, and DC to one
// DCT), so the notification arrives after the bytes are placed, and a
// WRITE that fails flushes its notification: its error completion carries
// the record's wr_id and fails the record as the culprit.
func (p *pqp) appendWRs(wrs []verbs.SendWR, r *rec, seq uint64, last bool) []verbs.SendWR {
	flags := p.flagsFor(r, last)
	if !r.notify {
		if len(wrs) < cap(wrs) {
			wrs = wrs[:len(wrs)+1]
		} else {
			wrs = append(wrs, verbs.SendWR{})
		}
		p.fillWR(&wrs[len(wrs)-1], r, seq, flags)
		return wrs
	}
	// A notifying WRITE: the WRITE, then its notification.
	k := len(wrs)
	wrs = append(wrs, verbs.SendWR{Op: verbs.OpWrite, RemoteAddr: r.raddr, RKey: r.rkey, SGL: p.localSGL(r)})
	wrs = append(wrs, verbs.SendWR{})
	wr := &wrs[len(wrs)-1]
	wr.ID, wr.Flags = uint64(r.q.id)<<32|seq&0xffffffff, flags
	wrs[k].ID = wr.ID
	if p.rc == nil {
		t := r.target
		for i := k; i < len(wrs); i++ {
			wrs[i].AH, wrs[i].RemoteQPN, wrs[i].DCKey = t.ah, t.dct, t.key
		}
	}
	start := len(p.sges)
	p.sges = append(p.sges, p.header(r, seq))
	wr.Op, wr.Imm = verbs.OpSendImm, r.dstPort|portHasImm
	wr.SGL = p.sges[start:len(p.sges):len(p.sges)]
	return wrs
}

// flagsFor is the send flags of record r's work request, the last of its
// posting or not (see appendWRs); p.mu held.
func (p *pqp) flagsFor(r *rec, last bool) verbs.SendFlags {
	if p.sinceSignal++; r.signaled || last || p.sinceSignal >= p.depth/2 {
		p.sinceSignal = 0
		return verbs.Signaled
	}
	return 0
}

// oneWR builds in p.wrs the work request of record r at physical
// sequence seq, alone in its posting and so signaled, for a record that is
// not a notifying WRITE (appendWRs builds those); p.mu held.
func (p *pqp) oneWR(r *rec, seq uint64) {
	p.sinceSignal = 0
	p.wrs, p.sges = p.wrs[:1], p.sges[:0]
	p.fillWR(&p.wrs[0], r, seq, verbs.Signaled)
}

// notifyWRs builds in p.wrs the two work requests of record r at physical
// sequence seq, a notifying WRITE alone in its posting (see appendWRs);
// p.mu held. Not inlined: pushDirect's cold path.
//
//go:noinline
func (p *pqp) notifyWRs(r *rec, seq uint64) {
	p.wrs, p.sges = p.wrs[:0], p.sges[:0]
	p.wrs = p.appendWRs(p.wrs, r, seq, true)
}

// fillWR writes wr, a used slot of the scratch work requests, as the work
// request of record r at physical sequence seq, a record that is not a
// notifying WRITE. It writes every field in place instead of zeroing the
// slot first (TestOneWR holds its result over a used slot to its result
// over a zeroed one), its SGEs appended to the scratch SGEs; p.mu held.
func (p *pqp) fillWR(wr *verbs.SendWR, r *rec, seq uint64, flags verbs.SendFlags) {
	wr.ID, wr.Op, wr.Flags, wr.Imm = uint64(r.q.id)<<32|seq&0xffffffff, r.op, flags, r.imm
	wr.RemoteAddr, wr.RKey, wr.CompareAdd, wr.Swap = r.raddr, r.rkey, r.cmp, r.swap
	if t := r.target; p.rc == nil {
		wr.AH, wr.RemoteQPN, wr.DCKey = t.ah, t.dct, t.key
	} else {
		wr.AH, wr.RemoteQPN, wr.DCKey = nil, 0, 0
	}
	wr.QKey = 0
	wr.SGL = nil
	if r.op.IsSend() {
		p.msgWR(wr, r, seq)
	} else if r.hasLocal {
		// The record's own SGE: it stays in the ring until the request
		// completes, past the posting (which copies the SGL).
		wr.SGL = unsafe.Slice(&r.local, 1)
	}
}

// msgWR makes wr, filled by fillWR, record r's message at physical
// sequence seq: a SEND_WITH_IMM whose immediate names the destination
// port, its header first (see header); p.mu held.
func (p *pqp) msgWR(wr *verbs.SendWR, r *rec, seq uint64) {
	wr.Op, wr.Imm = verbs.OpSendImm, r.dstPort
	if r.msgImm {
		wr.Imm |= portHasImm
	}
	n := len(p.sges)
	p.sges = append(p.sges, p.header(r, seq))
	if r.hasLocal && r.src == nil {
		p.sges = append(p.sges, r.local)
	}
	wr.SGL = p.sges[n:len(p.sges):len(p.sges)]
}

// localSGL is the SGL of r's local buffer, in the scratch SGEs.
func (p *pqp) localSGL(r *rec) []verbs.SGE {
	if !r.hasLocal {
		return nil
	}
	p.sges = append(p.sges, r.local)
	return p.sges[len(p.sges)-1 : len(p.sges) : len(p.sges)]
}

// header fills the header slot of sequence seq for r's message or
// notification, with the message itself if it travels there (r.src), and
// returns its SGE.
func (p *pqp) header(r *rec, seq uint64) verbs.SGE {
	slot := p.slot(seq) * hdrSlot
	// hdr.mem: header runs under mu, which destroy holds when it marks
	// the QP destroyed, before it deregisters hdr, so nothing writes it
	// after.
	h := p.hdr.mem[slot : slot+hdrSlot]
	le := binary.LittleEndian
	le.PutUint64(h, p.rt.node)
	le.PutUint32(h[8:], r.q.port.Load())
	le.PutUint32(h[12:], r.imm)
	if r.src != nil {
		off := r.local.Addr - r.src.addr
		n := copy(h[hdrLen:], r.src.mem[off:off+uint64(r.local.Length)]) // the request holds src
		return sge(p.hdr, p.hdr.Range(slot, hdrLen+n))
	}
	if !r.notify {
		return sge(p.hdr, p.hdr.Range(slot, hdrLen))
	}
	le.PutUint32(h[8:], r.q.port.Load()|hdrWrite)
	le.PutUint32(h[hdrLen:], r.local.Length)
	return sge(p.hdr, p.hdr.Range(slot, notifyLen))
}

// portHasImm flags, in a message's immediate, that the user's immediate in
// the header is meaningful.
const portHasImm = 1 << 31

// finished is a VQ request's outcome, reported after the pqp lock is
// released (a VQ's lock is never taken under a pqp's).
type finished struct {
	q      *Queue
	seq    uint64
	status verbs.Status
	n      uint32
}

// complete handles a completion of this QP. It returns the requests that
// finished; a failed one starts recovery.
func (p *pqp) complete(wc *verbs.WC, out []finished) []finished {
	p.mu.Lock()
	seq, ok := p.seqOf(wc.ID)
	if !ok {
		p.mu.Unlock()
		return out // stale: from before a recovery
	}
	for p.base < seq {
		out = p.retire(out)
	}
	if wc.Status == verbs.Success {
		out = p.retire(out)
		if len(p.backlog) > 0 {
			out = appendLost(out, p.drainLocked())
		}
	} else {
		out = p.failLocked(wc.Status, out)
	}
	p.mu.Unlock()
	return out
}

// completeOwn is complete for a caller that pops self's completions next
// (see pollFor), in the common cases: a success of the oldest request in
// flight, which is self's, or of a run of self's requests from the oldest
// (completeRun), with nothing backlogged behind it. It hands the outcomes
// to mine, leaving out the general dispatch (the outcomes gathered from
// every QP, then sorted out by queue), and reports true; false, having
// done nothing, for anything else (completeRun may have retired part of
// the run: complete retires the rest).
func (p *pqp) completeOwn(wc *verbs.WC, self *Queue, mine *ownRun) bool {
	if wc.Status != verbs.Success || mine.n == len(mine.fs) {
		return false
	}
	p.mu.Lock()
	r := &p.recs[p.slot(p.base)]
	if p.n == 0 || r.q != self || len(p.backlog) > 0 {
		p.mu.Unlock()
		return false
	}
	if uint32(wc.ID) != uint32(p.base) {
		return p.completeRun(wc, self, mine) // unlocks p.mu
	}
	mine.fs[mine.n] = outcome{seq: r.seq, n: r.local.Length, status: verbs.Success}
	mine.n++
	p.used -= r.wrs()
	*r = rec{}
	p.base++
	p.n--
	p.emptied()
	p.mu.Unlock()
	return true
}

// completeRun is completeOwn for a completion that retires several
// requests (a signaled one and the unsignaled ones before it, as a stream
// posts them): while they are self's requests of consecutive sequence
// numbers, it hands them to mine as one range (extending the range an
// earlier completion of the poll started), whose lengths are their
// entries' (see retireRange). It reports whether it retired all the
// completion covers; p.mu held, and unlocked.
func (p *pqp) completeRun(wc *verbs.WC, self *Queue, mine *ownRun) bool {
	defer p.mu.Unlock()
	seq, ok := p.seqOf(wc.ID)
	if !ok {
		return false
	}
	if mine.span == 0 {
		mine.lo = p.recs[p.slot(p.base)].seq
	}
	// The ring's counters moved once, after the walk.
	j, next, used := p.base, mine.lo+uint64(mine.span), 0
	recs, off, mask := p.recs, p.off, p.mask // slot's, read once
	for ; j <= seq; j++ {
		r := &recs[(j+off)&mask]
		if r.q != self || r.seq != next {
			break
		}
		next++
		used += r.wrs()
		*r = rec{}
	}
	k := int(j - p.base)
	p.base, p.n, p.used = j, p.n-k, p.used-used
	p.emptied()
	mine.span += k
	return j > seq
}

func appendLost(out []finished, lost []rec) []finished {
	for _, r := range lost {
		out = append(out, finished{q: r.q, seq: r.seq, status: verbs.WRFlushErr})
	}
	return out
}

// seqOf recovers the full physical sequence number from a wr_id's low 32
// bits, if it names a request in flight.
func (p *pqp) seqOf(id uint64) (uint64, bool) {
	d := uint32(id) - uint32(p.base)
	if int(d) >= p.n || p.n == 0 {
		return 0, false
	}
	return p.base + uint64(d), true
}

// retire removes the oldest in-flight record, which succeeded. It moved
// its local buffer's bytes (READ, WRITE, SEND payload, an atomic's 8): the
// record's own length, since a NIC reports a send-side length only for
// some opcodes (mlx5: READ and atomics), and an unsignaled request
// retired by a later completion has no completion of its own.
func (p *pqp) retire(out []finished) []finished {
	r := &p.recs[p.slot(p.base)]
	out = append(out, finished{q: r.q, seq: r.seq, status: verbs.Success, n: r.local.Length})
	p.used -= r.wrs()
	*r = rec{}
	p.base++
	p.n--
	p.emptied()
	return out
}

// failLocked handles an error completion of the oldest request in flight,
// the culprit. Everything behind it was flushed by the NIC; the records
// leave the ring (so their flush completions are ignored as stale) and a
// recovery goroutine decides their fate and repairs the QP.
func (p *pqp) failLocked(st verbs.Status, out []finished) []finished {
	culprit := p.recs[p.slot(p.base)]
	rest := make([]rec, 0, p.n-1)
	for i := 1; i < p.n; i++ {
		rest = append(rest, p.recs[p.slot(p.base+uint64(i))])
	}
	clear(p.recs)
	p.base, p.n, p.used = p.next, 0, 0
	p.broken = true
	p.rt.count(&p.rt.stats.recoveries)
	p.rt.goRecover(p, culprit, st, rest)
	return out
}
