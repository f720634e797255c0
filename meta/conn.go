package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// Per-server buffers of a client and their work request ids
// (kind<<56 | generation<<32 | index).
const (
	readBufLen = MaxSlots * SlotSize // one landing buffer holds any bucket
	udDepth    = 16                  // UD receive buffers, and send buffers
	udRecvLen  = 256                 // grhLen + replyLen, rounded up
	udTxLen    = 512                 // maxRequest, rounded up

	kindRead   = 1
	kindUDSend = 2
	kindUDRecv = 3
)

func wrID(kind, gen uint32, idx int) uint64 {
	return uint64(kind)<<56 | uint64(gen)<<32 | uint64(uint32(idx))
}

// Read slot states.
const (
	slotIdle      = iota
	slotPosted    // a READ is in flight; its waiter waits
	slotDone      // the READ completed; a token is on ready
	slotAbandoned // the waiter gave up; the handler frees the slot
)

// readSlot is a landing buffer for one bucket READ and its completion.
type readSlot struct {
	id     uint64
	off    int // offset in the connection's MR
	state  atomic.Int32
	status verbs.Status  // written by the handler before the token
	ready  chan struct{} // capacity 1
	wr     [1]verbs.SendWR
	sgl    [1]verbs.SGE
}

// call is a UD request waiting for its reply.
type call struct {
	ready chan struct{} // capacity 1
	rep   reply
}

// conn is a client's path to one MetaServer: a DCI for table READs, a UD
// QP for requests, one CQ for both, and their buffers. A server's failure
// only ever breaks its own conn, so failover never waits behind it.
type conn struct {
	c    *Client
	info Info
	cq   verbs.CQ
	ah   verbs.AH
	mem  *offheap.Block
	mr   verbs.MR
	poll *poller

	dciMu sync.RWMutex // held shared to post, exclusively to replace the DCI
	dci   verbs.QP

	udMu  sync.RWMutex // held shared to post, exclusively to replace the UD QP
	ud    verbs.QP
	udGen atomic.Uint32 // the UD QP's incarnation; stale receives are ignored

	slots  []*readSlot
	free   chan *readSlot
	txFree chan int

	pendMu  sync.Mutex
	pending map[uint64]*call

	geo   atomic.Pointer[geometry]
	hello chan struct{} // a one-token lock: one Hello at a time
}

// newConn creates the verbs resources for one server.
func (c *Client) newConn(info Info) (*conn, error) {
	sc := &conn{
		c: c, info: info, free: make(chan *readSlot, c.cfg.MaxInflight), txFree: make(chan int, udDepth),
		pending: make(map[uint64]*call), hello: make(chan struct{}, 1),
	}
	if err := sc.setup(); err != nil {
		return nil, errors.Join(fmt.Errorf("meta: client resources for server %s: %w", info.Addr, err), sc.close())
	}
	return sc, nil
}

func (sc *conn) setup() error {
	var err error
	n := sc.c.cfg.MaxInflight
	// Room for every queue's work several times over: QPs replaced after
	// an error leave their flushed completions behind until the next poll.
	if sc.cq, err = sc.c.dev.CreateCQ(1024 + 4*(n+2*udDepth)); err != nil {
		return err
	}
	sc.poll = newPoller(sc.cq, sc.c.stop, sc.handle)
	if sc.ah, err = sc.c.pd.CreateAH(verbs.AHAttr{Dest: sc.info.endpoint()}); err != nil {
		return err
	}
	if sc.mem, err = offheap.Alloc(n*readBufLen + udDepth*(udRecvLen+udTxLen)); err != nil {
		return err
	}
	if sc.mr, err = sc.c.pd.RegMR(sc.mem.Bytes(), verbs.AccessLocalWrite); err != nil {
		return err
	}
	for i := range n {
		s := &readSlot{id: wrID(kindRead, 0, i), off: i * readBufLen, ready: make(chan struct{}, 1)}
		sc.slots = append(sc.slots, s)
		sc.free <- s
	}
	for i := range udDepth {
		sc.txFree <- i
	}
	if sc.dci, err = sc.newDCI(); err != nil {
		return err
	}
	sc.ud, err = sc.newUD(sc.udGen.Add(1))
	return err
}

// close releases the conn's resources; the conn must be idle.
func (sc *conn) close() error {
	var errs []error
	for _, q := range []verbs.QP{sc.dci, sc.ud} {
		if q != nil {
			errs = append(errs, q.Close())
		}
	}
	if sc.ah != nil {
		errs = append(errs, sc.ah.Close())
	}
	if sc.mr != nil {
		errs = append(errs, sc.mr.Close())
	}
	if sc.mem != nil {
		errs = append(errs, sc.mem.Close())
	}
	if sc.cq != nil {
		errs = append(errs, sc.cq.Close())
	}
	return errors.Join(errs...)
}

// flush moves both QPs to ERR so every posted request completes and every
// waiter wakes: the first step of Close.
func (sc *conn) flush() {
	sc.dciMu.Lock()
	sc.dci.Modify(verbs.QPAttr{State: verbs.StateErr})
	sc.dciMu.Unlock()
	sc.udMu.Lock()
	sc.ud.Modify(verbs.QPAttr{State: verbs.StateErr})
	sc.udMu.Unlock()
}

// newDCI makes a DCI whose READs fail after ReadTimeout, the bound on
// waiting for a dead server before failing over.
func (sc *conn) newDCI() (verbs.QP, error) {
	n := sc.c.cfg.MaxInflight
	q, err := sc.c.pd.CreateQP(verbs.QPInit{Type: verbs.DCI, SendCQ: sc.cq, RecvCQ: sc.cq,
		Cap: verbs.QPCap{MaxSendWR: n, MaxSendSGE: 1}})
	if err != nil {
		return nil, fmt.Errorf("create DCI: %w", err)
	}
	// Seven retries of an eighth each: the same bound as one long wait,
	// but on hardware a single lost packet does not fail the READ.
	p := verbs.Path{Access: verbs.AccessLocalWrite, Timeout: sc.c.cfg.ReadTimeout / 8, RetryCount: 7}
	if err := verbs.Ready(q, p); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// newUD makes a UD QP of incarnation gen with every receive buffer posted.
func (sc *conn) newUD(gen uint32) (verbs.QP, error) {
	q, err := sc.c.pd.CreateQP(verbs.QPInit{Type: verbs.UD, SendCQ: sc.cq, RecvCQ: sc.cq,
		Cap: verbs.QPCap{MaxSendWR: udDepth, MaxRecvWR: udDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, fmt.Errorf("create UD QP: %w", err)
	}
	err = verbs.Ready(q, verbs.Path{QKey: sc.info.QKey, Timeout: sc.c.cfg.RequestTimeout, RetryCount: -1})
	for i := 0; err == nil && i < udDepth; i++ {
		err = postRecv(q, sc.mr, gen, i)
	}
	if err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

func postRecv(q verbs.QP, mr verbs.MR, gen uint32, i int) error {
	wr := verbs.RecvWR{ID: wrID(kindUDRecv, gen, i), SGL: []verbs.SGE{verbs.SGEOf(mr, recvOff(mr, i), udRecvLen)}}
	_, err := q.PostRecv([]verbs.RecvWR{wr})
	return err
}

// UD buffers follow the read slots at the end of the MR.
func recvOff(mr verbs.MR, i int) int { return mr.Len() - udDepth*(udRecvLen+udTxLen) + i*udRecvLen }
func txOff(mr verbs.MR, i int) int {
	return mr.Len() - udDepth*udTxLen + i*udTxLen
}

// handle dispatches one completion; the poller's leader calls it.
func (sc *conn) handle(wc *verbs.WC) {
	kind, gen, idx := uint32(wc.ID>>56), uint32(wc.ID>>32)&0xffffff, int(uint32(wc.ID))
	switch {
	case kind == kindRead && idx < len(sc.slots):
		sc.slots[idx].complete(sc, wc.Status)
	case kind == kindUDSend && idx < udDepth:
		sc.txFree <- idx
	case kind == kindUDRecv && idx < udDepth:
		sc.onRecv(gen, idx, wc)
	}
}

// complete hands a READ's outcome to its waiter, or frees the slot if the
// waiter gave up.
func (s *readSlot) complete(sc *conn, st verbs.Status) {
	s.status = st
	if s.state.CompareAndSwap(slotPosted, slotDone) {
		s.ready <- struct{}{}
	} else if s.state.CompareAndSwap(slotAbandoned, slotIdle) {
		sc.free <- s
	}
}

// onRecv delivers a reply and reposts its buffer. Receives of an older UD
// QP incarnation are ignored: its buffers were reposted to the new one.
func (sc *conn) onRecv(gen uint32, i int, wc *verbs.WC) {
	if gen != sc.udGen.Load() || wc.Status == verbs.WRFlushErr {
		return
	}
	if wc.Status == verbs.Success && wc.ByteLen == grhLen+replyLen {
		off := recvOff(sc.mr, i)
		if rep, err := decodeReply(sc.mr.Bytes()[off+grhLen : off+grhLen+replyLen]); err == nil {
			sc.deliver(rep)
		}
	}
	sc.udMu.RLock()
	if gen == sc.udGen.Load() {
		postRecv(sc.ud, sc.mr, gen, i) // fails only once the QP is in ERR; recovery reposts
	}
	sc.udMu.RUnlock()
}

func (sc *conn) deliver(rep reply) {
	sc.pendMu.Lock()
	defer sc.pendMu.Unlock()
	if cl := sc.pending[rep.id]; cl != nil {
		delete(sc.pending, rep.id)
		cl.rep = rep
		cl.ready <- struct{}{}
	}
}

// geometry returns the server's table geometry, asking for it (Hello) the
// first time and after it proved stale.
func (sc *conn) geometry(ctx context.Context) (*geometry, error) {
	if g := sc.geo.Load(); g != nil {
		return g, nil
	}
	select {
	case sc.hello <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-sc.hello }()
	if g := sc.geo.Load(); g != nil {
		return g, nil
	}
	rep, err := sc.call(ctx, request{op: opHello})
	if err != nil {
		return nil, err
	}
	g := rep.geo
	if err := g.check(); err != nil {
		return nil, fmt.Errorf("hello at %s: %w", sc.info.Addr, err)
	}
	sc.geo.Store(&g)
	return &g, nil
}

// fetch reads node's bucket (one READ) and scans it, reading again while
// the bucket comes back torn. A geometry that proves stale (the server
// restarted at the same address: unknown rkey or DCT) is refreshed once.
func (sc *conn) fetch(ctx context.Context, node uint64) (Record, error) {
	refreshed := false
	for torn := 0; ; {
		geo, err := sc.geometry(ctx)
		if err != nil {
			return Record{}, err
		}
		rec, err := sc.readBucket(ctx, geo, node)
		switch {
		case errors.Is(err, errTorn):
			sc.c.stats.torn.Add(1)
			if torn++; torn > sc.c.cfg.TornRetries {
				return Record{}, fmt.Errorf("READ at %s: %w (%d reads)", sc.info.Addr, ErrTorn, torn)
			}
		case !refreshed && (errors.Is(err, verbs.RemAccessErr) || errors.Is(err, verbs.RemInvReqErr)):
			refreshed = true
			sc.geo.CompareAndSwap(geo, nil)
		default:
			return rec, err
		}
	}
}

// readBucket READs node's bucket and scans it in the landing buffer.
func (sc *conn) readBucket(ctx context.Context, geo *geometry, node uint64) (Record, error) {
	s, err := sc.read(ctx, geo, bucketOf(node, int(geo.buckets)))
	if err != nil {
		return Record{}, err
	}
	rec, err := scanBucket(sc.mr.Bytes()[s.off:s.off+geo.bucketBytes()], node)
	sc.release(s)
	if errors.Is(err, errBadSlot) {
		err = fmt.Errorf("READ at %s: %w", sc.info.Addr, err)
	}
	return rec, err
}

// read posts one READ of bucket b into a free landing slot and waits for
// it. On success the caller owns the slot until release.
func (sc *conn) read(ctx context.Context, geo *geometry, b int) (*readSlot, error) {
	s, err := sc.acquire(ctx)
	if err != nil {
		return nil, err
	}
	n := geo.bucketBytes()
	s.sgl[0] = verbs.SGE{Addr: sc.mr.Addr() + uint64(s.off), Length: uint32(n), LKey: sc.mr.LKey()}
	s.wr[0] = verbs.SendWR{
		ID: s.id, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: s.sgl[:],
		RemoteAddr: geo.addr + uint64(b*n), RKey: geo.rkey, AH: sc.ah, RemoteQPN: geo.dct, DCKey: geo.dcKey,
	}
	s.state.Store(slotPosted)
	sc.dciMu.RLock()
	dci := sc.dci
	_, err = dci.PostSend(s.wr[:])
	sc.dciMu.RUnlock()
	if err != nil {
		sc.release(s)
		return nil, fmt.Errorf("post READ at %s: %w", sc.info.Addr, err)
	}
	sc.c.stats.reads.Add(1)
	if err := sc.poll.wait(ctx, s.ready); err != nil {
		if s.state.CompareAndSwap(slotPosted, slotAbandoned) {
			return nil, fmt.Errorf("READ at %s: %w", sc.info.Addr, err)
		}
		<-s.ready // it completed as we gave up: the token is on its way
	}
	if st := s.status; st != verbs.Success {
		sc.release(s)
		sc.recoverDCI(dci)
		return nil, fmt.Errorf("READ of bucket %d at %s: %w", b, sc.info.Addr, &verbs.CompletionError{ID: s.id, QPN: dci.Num(), Status: st})
	}
	return s, nil
}

// acquire takes a free landing slot, waiting while MaxInflight READs are
// in flight. The common case, a free slot, avoids a three-way select.
func (sc *conn) acquire(ctx context.Context) (*readSlot, error) {
	select {
	case s := <-sc.free:
		return s, nil
	default:
	}
	select {
	case s := <-sc.free:
		return s, nil
	case <-sc.c.stop:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (sc *conn) release(s *readSlot) {
	s.state.Store(slotIdle)
	sc.free <- s
}

// recoverDCI replaces a DCI that went to ERR (a READ failed: dead server,
// stale key). The failure already completed all its READs, so the old QP
// can go; the number of a DCI is nobody's business.
func (sc *conn) recoverDCI(broken verbs.QP) {
	sc.dciMu.Lock()
	defer sc.dciMu.Unlock()
	if sc.dci != broken || broken.State() != verbs.StateErr || sc.c.closed.Load() {
		return
	}
	q, err := sc.newDCI()
	if err != nil {
		return // the next READ fails on the old QP and tries again
	}
	sc.dci = q
	broken.Close()
	sc.c.stats.recoveries.Add(1)
}

// recoverUD replaces a UD QP that went to ERR (a request to an unreachable
// server). Its receives were flushed; the new incarnation reposts them.
func (sc *conn) recoverUD(broken verbs.QP) error {
	sc.udMu.Lock()
	defer sc.udMu.Unlock()
	if sc.ud != broken || broken.State() != verbs.StateErr || sc.c.closed.Load() {
		return nil
	}
	q, err := sc.newUD(sc.udGen.Add(1))
	if err != nil {
		return fmt.Errorf("replace UD QP for %s: %w", sc.info.Addr, err)
	}
	sc.ud = q
	broken.Close()
	sc.c.stats.recoveries.Add(1)
	return nil
}

// call sends a request and waits for its reply, retrying with a doubling
// timeout. Every attempt carries the same id, so the server applies the
// request once however many copies arrive.
func (sc *conn) call(ctx context.Context, req request) (reply, error) {
	req.id = sc.c.nextID()
	timeout := sc.c.cfg.RequestTimeout
	var last error
	for range sc.c.cfg.Attempts {
		actx, cancel := context.WithTimeout(ctx, timeout)
		rep, err := sc.roundTrip(actx, &req)
		cancel()
		if err == nil {
			return rep, nil
		}
		if ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return reply{}, fmt.Errorf("%s at %s: %w", req.op, sc.info.Addr, err)
		}
		last = err
		timeout = min(2*timeout, 16*sc.c.cfg.RequestTimeout)
	}
	return reply{}, fmt.Errorf("%s at %s: %w in %d attempts (last: %v)", req.op, sc.info.Addr, ErrNoReply, sc.c.cfg.Attempts, last)
}

// roundTrip is one attempt of a request.
func (sc *conn) roundTrip(ctx context.Context, req *request) (reply, error) {
	cl := &call{ready: make(chan struct{}, 1)}
	sc.pendMu.Lock()
	sc.pending[req.id] = cl
	sc.pendMu.Unlock()
	err := sc.send(ctx, req)
	if err == nil {
		err = sc.poll.wait(ctx, cl.ready)
	}
	if err != nil {
		sc.pendMu.Lock()
		mine := sc.pending[req.id] == cl
		if mine {
			delete(sc.pending, req.id)
		}
		sc.pendMu.Unlock()
		if mine {
			return reply{}, err
		}
		<-cl.ready // the reply was delivered as we gave up
	}
	if cl.rep.op != req.op || (req.op != opHello && cl.rep.node != req.node) {
		return reply{}, fmt.Errorf("%w: %s reply for node %d to a %s of node %d", errMalformed, cl.rep.op, cl.rep.node, req.op, req.node)
	}
	return cl.rep, nil
}

// send posts one copy of a request, replacing the UD QP first if an
// earlier request broke it.
func (sc *conn) send(ctx context.Context, req *request) error {
	var i int
	select {
	case i = <-sc.txFree:
	case <-sc.c.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	sc.udMu.RLock()
	if ud := sc.ud; ud.State() == verbs.StateErr {
		sc.udMu.RUnlock()
		if err := sc.recoverUD(ud); err != nil {
			sc.txFree <- i
			return err
		}
		sc.udMu.RLock()
	}
	defer sc.udMu.RUnlock()
	req.reply = sc.c.reply
	req.reply.QPN = sc.ud.Num()
	off := txOff(sc.mr, i)
	buf := req.encode(sc.mr.Bytes()[off : off : off+udTxLen])
	wr := verbs.SendWR{
		ID: wrID(kindUDSend, 0, i), Op: verbs.OpSend, Flags: verbs.Signaled,
		SGL: []verbs.SGE{verbs.SGEOf(sc.mr, off, len(buf))},
		AH:  sc.ah, RemoteQPN: sc.info.QPN, QKey: sc.info.QKey,
	}
	if _, err := sc.ud.PostSend([]verbs.SendWR{wr}); err != nil {
		sc.txFree <- i
		return fmt.Errorf("post %s at %s: %w", req.op, sc.info.Addr, err)
	}
	return nil
}

// register stores rec on this server and returns the lease it granted.
func (sc *conn) register(ctx context.Context, rec Record, lease time.Duration) (time.Duration, error) {
	rep, err := sc.call(ctx, request{op: opRegister, node: rec.Node, lease: lease, rec: rec})
	if err != nil {
		return 0, err
	}
	return rep.lease, sc.refused(opRegister, rep.status)
}

// renew extends node's lease; if the server lost the record (it
// restarted, or the lease lapsed while it was unreachable) it registers
// rec again.
func (sc *conn) renew(ctx context.Context, rec Record, lease time.Duration) (time.Duration, error) {
	rep, err := sc.call(ctx, request{op: opRenew, node: rec.Node, lease: lease})
	switch {
	case err != nil:
		return 0, err
	case rep.status == stNotFound:
		return sc.register(ctx, rec, lease)
	}
	return rep.lease, sc.refused(opRenew, rep.status)
}

// deregister removes node; a server that does not hold it agrees.
func (sc *conn) deregister(ctx context.Context, node uint64) error {
	rep, err := sc.call(ctx, request{op: opDeregister, node: node})
	if err != nil || rep.status == stNotFound {
		return err
	}
	return sc.refused(opDeregister, rep.status)
}

// refused is the error for a reply's status, naming the server; nil if ok.
func (sc *conn) refused(o op, st status) error {
	if err := st.err(); err != nil {
		return fmt.Errorf("%s at %s: %w", o, sc.info.Addr, err)
	}
	return nil
}

// Buffer sizes must hold the messages they carry: a negative array
// length stops the build if a message outgrows its buffer.
var (
	_ [udTxLen - maxRequest]byte
	_ [udRecvLen - grhLen - replyLen]byte
	_ [srvRecvLen - grhLen - maxRequest]byte
	_ [srvTxLen - replyLen]byte
)
