package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore/internal/udrpc"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// Per-server buffers of a client and the READs' work request ids
// (kindRead<<56 | index).
const (
	readBufLen = MaxSlots * SlotSize // one landing buffer holds any bucket
	kindRead   = 1
)

func wrID(kind uint32, idx int) uint64 { return uint64(kind)<<56 | uint64(uint32(idx)) }

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

// conn is a client's path to one MetaServer: the QP table READs go on (a
// DCI, or on a device without DC an RC QP to the server set up by a UD
// handshake and kept), its CQ and landing buffers, and a UD endpoint for
// requests. A server's failure only ever breaks its own conn, so failover
// never waits behind it.
type conn struct {
	c    *Client
	info Info
	cq   verbs.CQ // the reader's
	ah   verbs.AH
	mem  *offheap.Block
	mr   verbs.MR
	poll *udrpc.Poller
	ud   *udrpc.Endpoint
	dest udrpc.Dest // the server's request QP

	rdMu sync.RWMutex // held shared to post, exclusively to replace the reader
	rd   verbs.QP     // nil while an RC reader is not connected
	rc   bool         // READs go over RC: no DC here or at the server

	slots []*readSlot
	free  chan *readSlot

	geo   atomic.Pointer[geometry]
	hello chan struct{} // a one-token lock: one Hello at a time
}

// newConn creates the verbs resources for one server.
func (c *Client) newConn(info Info) (*conn, error) {
	sc := &conn{c: c, info: info, free: make(chan *readSlot, c.cfg.MaxInflight), hello: make(chan struct{}, 1), rc: !c.dc}
	if err := sc.setup(); err != nil {
		return nil, errors.Join(fmt.Errorf("meta: client resources for server %s: %w", info.Addr, err), sc.close())
	}
	return sc, nil
}

func (sc *conn) setup() error {
	var err error
	n := sc.c.cfg.MaxInflight
	// Room for every READ several times over: readers replaced after an
	// error leave their flushed completions behind until the next poll.
	if sc.cq, err = sc.c.dev.CreateCQ(1024 + 4*n); err != nil {
		return err
	}
	sc.poll = udrpc.NewPoller(sc.cq, sc.c.stop, ErrClosed, sc.handle)
	if sc.ah, err = sc.c.pd.CreateAH(verbs.AHAttr{Dest: sc.info.endpoint()}); err != nil {
		return err
	}
	sc.dest = udrpc.Dest{AH: sc.ah, QPN: sc.info.QPN}
	if sc.mem, err = offheap.Alloc(n * readBufLen); err != nil {
		return err
	}
	if sc.mr, err = sc.c.pd.RegMR(sc.mem.Bytes(), verbs.AccessLocalWrite); err != nil {
		return err
	}
	for i := range n {
		s := &readSlot{id: wrID(kindRead, i), off: i * readBufLen, ready: make(chan struct{}, 1)}
		sc.slots = append(sc.slots, s)
		sc.free <- s
	}
	if !sc.rc {
		if sc.rd, err = sc.newDCI(); err != nil {
			return err
		}
	}
	sc.ud, err = udrpc.New(sc.c.dev, sc.c.pd, udrpc.Config{
		QKey: sc.info.QKey, MaxMsg: udMaxMsg, Timeout: sc.c.cfg.RequestTimeout, Attempts: sc.c.cfg.Attempts,
		ReplyID: replyID, Closed: ErrClosed,
	})
	return err
}

// udMaxMsg bounds a client's UD messages: a request with the longest reply
// address (replies are shorter).
const udMaxMsg = 512

// replyID tells the udrpc endpoint which call a reply answers; a client
// takes no requests.
func replyID(msg []byte) (uint64, bool) {
	rep, err := decodeReply(msg)
	return rep.id, err == nil
}

// close releases the conn's resources; the conn must be idle.
func (sc *conn) close() error {
	var errs []error
	if sc.rd != nil {
		errs = append(errs, sc.rd.Close())
	}
	if sc.ud != nil {
		errs = append(errs, sc.ud.Close())
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

// flush moves the QPs to ERR so every posted request completes and every
// waiter wakes: the first step of Close.
func (sc *conn) flush() {
	sc.rdMu.Lock()
	if sc.rd != nil {
		sc.rd.Modify(verbs.QPAttr{State: verbs.StateErr})
	}
	sc.rdMu.Unlock()
	sc.ud.Shutdown()
}

// readPath is the reader's path: its READs fail after ReadTimeout, the
// bound on waiting for a dead server before failing over. Seven retries of
// an eighth each: the same bound as one long wait, but on hardware a
// single lost packet does not fail the READ.
func (sc *conn) readPath() verbs.Path {
	return verbs.Path{Access: verbs.AccessLocalWrite, Timeout: sc.c.cfg.ReadTimeout / 8, RetryCount: 7}
}

// newDCI makes a DCI for table READs.
func (sc *conn) newDCI() (verbs.QP, error) {
	q, err := sc.c.pd.CreateQP(verbs.QPInit{Type: verbs.DCI, SendCQ: sc.cq, RecvCQ: sc.cq,
		Cap: verbs.QPCap{MaxSendWR: sc.c.cfg.MaxInflight, MaxSendSGE: 1}})
	if err != nil {
		return nil, fmt.Errorf("create DCI: %w", err)
	}
	if err := verbs.Ready(q, sc.readPath()); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// connectRC makes the RC reader of a client without DC (or of a server
// without a DCT): a UD handshake asks the server for an RC QP that may
// only READ the table, and the pair is kept for every later READ. rdMu is
// held.
func (sc *conn) connectRC(ctx context.Context) (verbs.QP, error) {
	q, err := sc.c.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: sc.cq, RecvCQ: sc.cq,
		Cap: verbs.QPCap{MaxSendWR: sc.c.cfg.MaxInflight, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, fmt.Errorf("create RC reader: %w", err)
	}
	// A server that does not answer within ReadTimeout is failed over, as
	// one whose READ does not complete.
	ctx, cancel := context.WithTimeout(ctx, sc.c.cfg.ReadTimeout)
	defer cancel()
	ep := q.Endpoint()
	rep, err := sc.call(ctx, request{op: opConnect, node: sc.c.id, rcQPN: ep.QPN, rcPSN: ep.PSN})
	if err == nil {
		err = sc.refused(opConnect, rep.status)
	}
	if err == nil {
		remote := sc.info.endpoint()
		remote.QPN, remote.PSN = rep.qpn, rep.psn
		err = verbs.Connect(q, remote, sc.readPath())
	}
	if err != nil {
		q.Close()
		return nil, err
	}
	sc.c.stats.connects.Add(1)
	return q, nil
}

// reader returns the QP to post a READ on, with rdMu held shared (the
// caller unlocks), connecting the RC reader first if there is none.
func (sc *conn) reader(ctx context.Context) (verbs.QP, error) {
	for {
		sc.rdMu.RLock()
		if sc.rd != nil {
			return sc.rd, nil
		}
		sc.rdMu.RUnlock()
		sc.rdMu.Lock()
		var err error
		if sc.rd == nil {
			sc.rd, err = sc.connectRC(ctx)
		}
		sc.rdMu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// useRC switches the conn to RC READs, for a server without a DCT.
func (sc *conn) useRC() {
	sc.rdMu.Lock()
	defer sc.rdMu.Unlock()
	if sc.rc {
		return
	}
	sc.rc = true
	if sc.rd != nil {
		sc.rd.Close()
		sc.rd = nil
	}
}

// handle dispatches one READ completion; the poller's leader calls it.
func (sc *conn) handle(wc *verbs.WC) {
	if idx := int(uint32(wc.ID)); wc.ID>>56 == kindRead && idx < len(sc.slots) {
		sc.slots[idx].complete(sc, wc.Status)
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
	if g.dct == 0 {
		sc.useRC() // the server has no DCT: its table is READ over RC
	}
	sc.geo.Store(&g)
	return &g, nil
}

// fetch reads node's bucket (one READ) and scans it, reading again while
// the bucket comes back torn (tornPause). A geometry that proves stale
// (the server restarted at the same address: unknown rkey or DCT) is
// refreshed once, and an RC reader that stopped answering is reconnected
// once.
func (sc *conn) fetch(ctx context.Context, node uint64) (Record, error) {
	refreshed, reconnected := false, false
	var tornSince time.Time
	for torn := 0; ; {
		geo, err := sc.geometry(ctx)
		if err != nil {
			return Record{}, err
		}
		rec, err := sc.readBucket(ctx, geo, node)
		switch {
		case errors.Is(err, errTorn):
			sc.c.stats.torn.Add(1)
			if torn++; torn == 1 {
				tornSince = time.Now()
			}
			if d := time.Since(tornSince); d > sc.c.cfg.TornWait {
				return Record{}, fmt.Errorf("READ at %s: %w (%d reads in %v)", sc.info.Addr, ErrTorn, torn, d.Round(time.Microsecond))
			}
			if p := tornPause(torn); p > 0 && !sleepCtx(ctx, p) {
				return Record{}, fmt.Errorf("READ at %s: bucket torn (%d reads): %w", sc.info.Addr, torn, ctx.Err())
			}
		case !refreshed && (errors.Is(err, verbs.RemAccessErr) || errors.Is(err, verbs.RemInvReqErr)):
			refreshed = true
			sc.geo.CompareAndSwap(geo, nil)
		case !reconnected && sc.rc && errors.Is(err, verbs.RetryExcErr):
			// The server may have dropped our reader (it keeps MaxReaders):
			// the next READ connects a new one.
			reconnected = true
		default:
			return rec, err
		}
	}
}

// tornPause is the wait before READing a torn bucket again, after torn
// torn READs. A writer on the CPU finishes a slot in nanoseconds, so the
// first READs again go at once; a slot still torn after them has a writer
// off the CPU, which a reader spinning on a core would keep off it, so
// the pauses double from 10us up to 1ms.
func tornPause(torn int) time.Duration {
	const immediate = 4
	if torn <= immediate {
		return 0
	}
	return min(10*time.Microsecond<<min(torn-immediate-1, 7), time.Millisecond)
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
	s.wr[0] = verbs.SendWR{ID: s.id, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: s.sgl[:], RemoteAddr: geo.addr + uint64(b*n), RKey: geo.rkey}
	rd, err := sc.reader(ctx)
	if err != nil {
		sc.release(s)
		return nil, fmt.Errorf("RC reader at %s: %w", sc.info.Addr, err)
	}
	if rd.Type() == verbs.DCI {
		s.wr[0].AH, s.wr[0].RemoteQPN, s.wr[0].DCKey = sc.ah, geo.dct, geo.dcKey
	}
	s.state.Store(slotPosted)
	_, err = rd.PostSend(s.wr[:])
	sc.rdMu.RUnlock()
	if err != nil {
		sc.release(s)
		return nil, fmt.Errorf("post READ at %s: %w", sc.info.Addr, err)
	}
	sc.c.stats.reads.Add(1)
	if err := sc.poll.Wait(ctx, s.ready); err != nil {
		if s.state.CompareAndSwap(slotPosted, slotAbandoned) {
			return nil, fmt.Errorf("READ at %s: %w", sc.info.Addr, err)
		}
		<-s.ready // it completed as we gave up: the token is on its way
	}
	if st := s.status; st != verbs.Success {
		sc.release(s)
		sc.recoverReader(rd)
		return nil, fmt.Errorf("READ of bucket %d at %s: %w", b, sc.info.Addr, &verbs.CompletionError{ID: s.id, QPN: rd.Num(), Status: st})
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

// recoverReader replaces a reader that went to ERR (a READ failed: dead
// server, stale key). The failure already completed all its READs, so the
// old QP can go. A DCI is replaced at once (the number of a DCI is
// nobody's business); an RC reader is dropped and the next READ connects
// a new one, with the server's help.
func (sc *conn) recoverReader(broken verbs.QP) {
	sc.rdMu.Lock()
	defer sc.rdMu.Unlock()
	if sc.rd != broken || broken.State() != verbs.StateErr || sc.c.closed.Load() {
		return
	}
	if broken.Type() == verbs.DCI {
		q, err := sc.newDCI()
		if err != nil {
			return // the next READ fails on the old QP and tries again
		}
		sc.rd = q
	} else {
		sc.rd = nil
	}
	broken.Close()
	sc.c.stats.recoveries.Add(1)
}

// call sends a request over UD and waits for its reply (see udrpc.Call:
// every copy carries the same id, so the server applies it once).
func (sc *conn) call(ctx context.Context, req request) (reply, error) {
	req.id = sc.c.nextID()
	return sc.exchange(ctx, &req)
}

// exchange is call with the request id set.
func (sc *conn) exchange(ctx context.Context, req *request) (reply, error) {
	req.reply = sc.c.reply
	req.reply.QPN = sc.ud.QPN()
	var buf [maxRequest]byte
	b, err := sc.ud.Call(ctx, sc.dest, req.id, req.encode(buf[:0]))
	if err != nil {
		return reply{}, fmt.Errorf("%s at %s: %w", req.op, sc.info.Addr, noReply(err))
	}
	rep, err := decodeReply(b)
	if err == nil && (rep.op != req.op || (req.op != opHello && rep.node != req.node)) {
		err = fmt.Errorf("%w: %s reply for node %d to a %s of node %d", errMalformed, rep.op, rep.node, req.op, req.node)
	}
	return rep, err
}

// noReply makes udrpc's ErrNoReply this package's.
func noReply(err error) error {
	if errors.Is(err, udrpc.ErrNoReply) {
		return fmt.Errorf("%w: %w", ErrNoReply, err)
	}
	return err
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
	_ [udMaxMsg - maxRequest]byte
	_ [srvRecvLen - grhLen - maxRequest]byte
	_ [srvTxLen - replyLen]byte
)
