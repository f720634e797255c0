package meta

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore/internal/nonce"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// ServerConfig configures a MetaServer. The zero value is usable.
type ServerConfig struct {
	// Buckets is the number of table buckets (1..MaxBuckets); default
	// 1024. The table holds Buckets*Slots records at most, and a record
	// whose bucket is full is refused (ErrTableFull) or, mirrored, not
	// served: size it for the cluster (TableFor).
	Buckets int
	// Slots is the number of records per bucket (1..MaxSlots); default 4.
	// A lookup READs Slots*SlotSize bytes.
	Slots int
	// Lease is granted when a Register asks for none; default 10s.
	Lease time.Duration
	// MinLease and MaxLease bound the leases granted; default 10ms and
	// 10m. A short lease makes a dead node vanish sooner at the cost of
	// more renewals.
	MinLease, MaxLease time.Duration
	// QKey is the UD queue key requests must carry; 0 picks a random one.
	QKey uint32
	// DCKey is the table DCT's access key; 0 picks a random one.
	DCKey uint64
	// RecvDepth is the number of request buffers posted; default 256.
	// Requests arriving while all are in use are dropped (and retried by
	// their clients).
	RecvDepth int
	// ReplyTimeout bounds how long a reply to an unreachable client can
	// hold up the UD QP before the server resets it; default 100ms.
	ReplyTimeout time.Duration
	// DedupWindow is how long a node's last reply is kept to answer a
	// retried request without applying it twice; default 30s. It must
	// exceed a client's retry horizon.
	DedupWindow time.Duration
	// NoDC serves the table over RC only, with no DCT, as on a device
	// without DC (where it is the default).
	NoDC bool
	// MaxReaders bounds the RC QPs kept for clients that READ over RC;
	// default 1024. Past it the oldest is closed (its client reconnects).
	MaxReaders int
	// Membership, if set, is the source of truth for the records: the
	// server mirrors it into its table (nodes register there, not with
	// the server, which answers UD registrations "invalid") and announces
	// itself in it under a lease of Lease. Nil: the server keeps the
	// records itself (the embedded default).
	Membership Membership
}

// ServerStats counts a server's work.
type ServerStats struct {
	Records    int    // live records
	Requests   uint64 // well-framed requests received
	Duplicates uint64 // retried requests answered from the dedup cache
	Dropped    uint64 // malformed requests and replies that could not be sent
	Expired    uint64 // records removed because their lease lapsed
	Resets     uint64 // UD QP recoveries after a failed reply
	Readers    int    // RC QPs serving clients' READs
	Updates    uint64 // membership updates mirrored into the table
	Unplaced   uint64 // mirrored records that found their bucket full
	Watches    uint64 // membership watches started (more than one: the stream broke)
}

func (c ServerConfig) withDefaults() (ServerConfig, error) {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if err := CheckTable(c.Buckets, c.Slots); err != nil {
		return c, fmt.Errorf("meta: server config: %w", err)
	}
	if c.Buckets == 0 {
		c.Buckets = DefaultBuckets
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.RecvDepth <= 0 {
		c.RecvDepth = 256
	}
	if c.MaxReaders <= 0 {
		c.MaxReaders = 1024
	}
	def(&c.Lease, 10*time.Second)
	def(&c.MinLease, 10*time.Millisecond)
	def(&c.MaxLease, 10*time.Minute)
	def(&c.ReplyTimeout, 100*time.Millisecond)
	def(&c.DedupWindow, 30*time.Second)
	for c.QKey == 0 {
		c.QKey = uint32(nonce.Uint64()) & 0x7fffffff // the high bit marks controlled QKeys on IB
	}
	for c.DCKey == 0 {
		c.DCKey = nonce.Uint64()
	}
	if c.MinLease > c.MaxLease || c.Lease < c.MinLease || c.Lease > c.MaxLease {
		return c, fmt.Errorf("meta: server config: leases min %v default %v max %v: %w",
			c.MinLease, c.Lease, c.MaxLease, ErrBadGeometry)
	}
	return c, nil
}

// Server buffer layout and work request ids.
const (
	srvRecvLen = 512 // grhLen + maxRequest, rounded up
	srvTxLen   = 128 // replyLen, rounded up
	srvTxCount = 64
	kindRecv   = 1
	kindSend   = 2
	maxAHs     = 1024
)

// Server is a MetaServer: it keeps node records in one registered table
// that clients READ through a DCT (or, without DC, through an RC QP each
// client asks for over UD), and takes registrations over UD. One
// goroutine, started by NewServer and stopped by Close, owns the table and
// every queue; other methods only read immutable fields and counters.
type Server struct {
	cfg  ServerConfig
	info Info
	geo  geometry

	pd     verbs.PD
	cq     verbs.CQ
	tblMem *offheap.Block
	tblMR  verbs.MR
	srq    verbs.SRQ
	dct    verbs.QP
	ud     verbs.QP
	bufMem *offheap.Block
	bufMR  verbs.MR

	// Owned by the loop goroutine.
	tbl       *table
	wcs       []verbs.WC
	txFree    []int
	ahs       map[verbs.Endpoint]verbs.AH
	entries   map[uint64]*entry
	leases    leaseHeap
	dedup     map[uint64]*dedupEntry
	dedupNext time.Time
	udBroken  bool
	readers   map[uint64]*reader // RC QPs for clients' READs, by client id

	stats struct {
		records, readers                               atomic.Int64
		requests, duplicates, dropped, expired, resets atomic.Uint64
		updates, unplaced, watches                     atomic.Uint64
	}
	feed    feed // membership updates for the loop to mirror
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	once    sync.Once
	loopErr error // set by the loop before it exits
}

// entry is a live record's server-side state.
type entry struct {
	node    uint64
	slot    int
	rec     Record // content, without version
	version uint64
	lease   time.Duration
	expires time.Time
}

// dedupEntry is a node's last answered request.
type dedupEntry struct {
	id    uint64
	op    op
	reply reply
	at    time.Time
}

// NewServer creates a MetaServer on dev and starts serving. Give clients
// its Info.
func NewServer(dev verbs.Device, cfg ServerConfig) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.NoDC = cfg.NoDC || !dev.Attr().DCSupported
	s := &Server{
		cfg: cfg, wcs: make([]verbs.WC, 32), ahs: make(map[verbs.Endpoint]verbs.AH),
		entries: make(map[uint64]*entry), dedup: make(map[uint64]*dedupEntry), readers: make(map[uint64]*reader),
	}
	if err := s.setup(dev); err != nil {
		return nil, errors.Join(fmt.Errorf("meta: start server on %s: %w", dev.Name(), err), s.teardown())
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.run()
	if cfg.Membership != nil {
		s.wg.Add(2)
		go s.follow()
		go s.announce()
	}
	return s, nil
}

// setup creates the verbs resources: the table MR and the DCT clients
// READ it through, and the UD QP with its request and reply buffers.
func (s *Server) setup(dev verbs.Device) error {
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		return err
	}
	if s.cq, err = dev.CreateCQ(2 * (s.cfg.RecvDepth + srvTxCount)); err != nil {
		return err
	}
	if err := s.setupTable(); err != nil {
		return err
	}
	if err := s.setupUD(); err != nil {
		return err
	}
	port := dev.Port()
	s.info = Info{Addr: port.Addr, GID: port.GID, LID: port.LID, QPN: s.ud.Num(), QKey: s.cfg.QKey}
	s.geo = geometry{
		addr: s.tblMR.Addr(), rkey: s.tblMR.RKey(), buckets: uint32(s.cfg.Buckets), slots: uint32(s.cfg.Slots),
		slotSize: SlotSize, dcKey: s.cfg.DCKey, epoch: nonce.Uint64(), maxLease: s.cfg.MaxLease,
	}
	if s.dct != nil {
		s.geo.dct = s.dct.Num()
	}
	return nil
}

// setupTable registers the table read-only for remote peers behind a DCT
// that allows nothing but READ (none without DC: clients READ over RC
// QPs that allow nothing else either): clients cannot write it.
func (s *Server) setupTable() error {
	var err error
	if s.tblMem, err = offheap.Alloc(tableBytes(s.cfg.Buckets, s.cfg.Slots)); err != nil {
		return err
	}
	if s.tbl, err = newTable(s.tblMem.Bytes(), s.cfg.Buckets, s.cfg.Slots); err != nil {
		return err
	}
	if s.tblMR, err = s.pd.RegMR(s.tblMem.Bytes(), verbs.AccessRemoteRead); err != nil {
		return fmt.Errorf("register table: %w", err)
	}
	if s.cfg.NoDC {
		return nil
	}
	if s.srq, err = s.pd.CreateSRQ(verbs.SRQInit{MaxWR: 1, MaxSGE: 1}); err != nil {
		return err
	}
	s.dct, err = s.pd.CreateQP(verbs.QPInit{Type: verbs.DCT, SendCQ: s.cq, RecvCQ: s.cq, SRQ: s.srq, DCKey: s.cfg.DCKey})
	if err != nil {
		return fmt.Errorf("create DCT: %w", err)
	}
	return verbs.Ready(s.dct, verbs.Path{Access: verbs.AccessRemoteRead})
}

// setupUD creates the request QP and posts its receive buffers.
func (s *Server) setupUD() error {
	var err error
	size := s.cfg.RecvDepth*srvRecvLen + srvTxCount*srvTxLen
	if s.bufMem, err = offheap.Alloc(size); err != nil {
		return err
	}
	if s.bufMR, err = s.pd.RegMR(s.bufMem.Bytes(), verbs.AccessLocalWrite); err != nil {
		return fmt.Errorf("register buffers: %w", err)
	}
	s.ud, err = s.pd.CreateQP(verbs.QPInit{Type: verbs.UD, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: srvTxCount, MaxRecvWR: s.cfg.RecvDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fmt.Errorf("create UD QP: %w", err)
	}
	return s.readyUD()
}

// readyUD brings the UD QP from RESET to RTS with every buffer free and
// every receive posted.
func (s *Server) readyUD() error {
	if err := verbs.Ready(s.ud, verbs.Path{QKey: s.cfg.QKey, Timeout: s.cfg.ReplyTimeout, RetryCount: -1}); err != nil {
		return err
	}
	s.txFree = s.txFree[:0]
	for i := range srvTxCount {
		s.txFree = append(s.txFree, i)
	}
	for i := range s.cfg.RecvDepth {
		if err := s.postRecv(i); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) postRecv(i int) error {
	wr := verbs.RecvWR{ID: kindRecv<<32 | uint64(i), SGL: []verbs.SGE{verbs.SGEOf(s.bufMR, i*srvRecvLen, srvRecvLen)}}
	if _, err := s.ud.PostRecv([]verbs.RecvWR{wr}); err != nil {
		return fmt.Errorf("post request buffer %d: %w", i, err)
	}
	return nil
}

func (s *Server) recvBuf(i int) []byte { return s.bufMR.Bytes()[i*srvRecvLen : (i+1)*srvRecvLen] }

func (s *Server) txOff(i int) int { return s.cfg.RecvDepth*srvRecvLen + i*srvTxLen }

// Info is what clients need to reach the server.
func (s *Server) Info() Info { return s.info }

// Stats reports the server's counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{
		Records: int(s.stats.records.Load()), Requests: s.stats.requests.Load(), Duplicates: s.stats.duplicates.Load(),
		Dropped: s.stats.dropped.Load(), Expired: s.stats.expired.Load(), Resets: s.stats.resets.Load(),
		Readers: int(s.stats.readers.Load()), Updates: s.stats.updates.Load(), Unplaced: s.stats.unplaced.Load(),
		Watches: s.stats.watches.Load(),
	}
}

// Source says where the server's records come from: "embedded" when it
// keeps them itself, else its Membership (e.g. "etcd 10.0.0.1:2379 /krcore/").
func (s *Server) Source() string {
	if s.cfg.Membership == nil {
		return "embedded"
	}
	return s.cfg.Membership.String()
}

// Close stops the server's goroutine and releases its resources. Clients
// reading the table afterwards fail (no such DCT) and fail over. It returns
// the error that stopped the loop early, if one did.
func (s *Server) Close() error {
	err := ErrClosed
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
		err = errors.Join(s.loopErr, s.teardown())
	})
	return err
}

// teardown releases whatever setup created, in dependency order.
func (s *Server) teardown() error {
	var errs []error
	closeIf := func(c interface{ Close() error }, ok bool) {
		if ok {
			errs = append(errs, c.Close())
		}
	}
	closeIf(s.ud, s.ud != nil)
	for _, r := range s.readers {
		errs = append(errs, r.qp.Close())
	}
	closeIf(s.dct, s.dct != nil)
	closeIf(s.srq, s.srq != nil)
	for _, ah := range s.ahs {
		errs = append(errs, ah.Close())
	}
	closeIf(s.tblMR, s.tblMR != nil)
	closeIf(s.bufMR, s.bufMR != nil)
	closeIf(s.tblMem, s.tblMem != nil)
	closeIf(s.bufMem, s.bufMem != nil)
	closeIf(s.cq, s.cq != nil)
	closeIf(s.pd, s.pd != nil)
	return errors.Join(errs...)
}

// run is the server loop: serve requests, expire leases, sleep on the CQ
// until the next completion or lease deadline.
func (s *Server) run() {
	defer s.wg.Done()
	for {
		n, err := s.cq.Poll(s.wcs)
		if err != nil {
			s.loopErr = fmt.Errorf("meta: server CQ: %w", err)
			return
		}
		now := time.Now()
		for i := range s.wcs[:n] {
			s.handle(&s.wcs[i], now)
		}
		if s.udBroken {
			if err := s.recoverUD(); err != nil {
				s.loopErr = fmt.Errorf("meta: recover server UD QP: %w", err)
				return
			}
		}
		s.expire(now)
		if s.cfg.Membership != nil {
			s.mirrorPending()
		}
		if n == 0 && !s.sleep(now) {
			return
		}
	}
}

// sleep waits for a completion or the next deadline; false once closing.
func (s *Server) sleep(now time.Time) bool {
	ctx, cancel := s.ctx, context.CancelFunc(func() {})
	at, timed := s.nextDeadline()
	if timed {
		ctx, cancel = context.WithDeadline(s.ctx, at)
	}
	if s.cfg.Membership != nil {
		ctx, cancel = s.feed.sleeping(ctx, cancel)
	}
	err := s.cq.Wait(ctx)
	cancel()
	if late := time.Since(at); timed && late >= pauseGrace {
		s.postpone(late)
	}
	if s.cfg.Membership != nil {
		s.feed.awake()
	}
	switch {
	case s.ctx.Err() != nil:
		return false
	case err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled):
		s.loopErr = fmt.Errorf("meta: server CQ: %w", err)
		return false
	}
	return true
}

// nextDeadline is when the loop must wake without a completion: the
// earliest lease to check or the next dedup sweep.
func (s *Server) nextDeadline() (time.Time, bool) {
	var at time.Time
	if len(s.leases) > 0 {
		at = s.leases[0].at
	}
	if len(s.dedup) > 0 && (at.IsZero() || s.dedupNext.Before(at)) {
		at = s.dedupNext
	}
	return at, !at.IsZero()
}

// handle processes one completion.
func (s *Server) handle(wc *verbs.WC, now time.Time) {
	idx := int(uint32(wc.ID))
	switch wc.ID >> 32 {
	case kindSend:
		s.txFree = append(s.txFree, idx)
		if wc.Status != verbs.Success {
			s.udBroken = true // a UD send error moved the QP to ERR
		}
	case kindRecv:
		if idx >= s.cfg.RecvDepth || wc.Status == verbs.WRFlushErr {
			s.udBroken = s.udBroken || wc.Status == verbs.WRFlushErr
			return // recovery reposts every buffer
		}
		if wc.Status == verbs.Success && wc.ByteLen >= grhLen && int(wc.ByteLen) <= srvRecvLen {
			s.serve(s.recvBuf(idx)[grhLen:wc.ByteLen], now)
		} else {
			s.stats.dropped.Add(1) // e.g. LOC_LEN_ERR: a datagram larger than any request
		}
		if err := s.postRecv(idx); err != nil {
			s.udBroken = true
		}
	}
}

// serve answers one request. Malformed bytes are counted and ignored: the
// sender may not even be a client, and a reply needs a trusted address.
func (s *Server) serve(msg []byte, now time.Time) {
	req, err := decodeRequest(msg)
	if err != nil {
		s.stats.dropped.Add(1)
		return
	}
	s.stats.requests.Add(1)
	rep := s.answer(&req, now)
	s.send(req.reply, &rep)
}

// answer applies a request once: a retry of a node's last request (same
// id) gets the first answer again, so a retried Deregister does not report
// NotFound and a retried Register does not bump the version.
func (s *Server) answer(req *request, now time.Time) reply {
	if req.op == opHello {
		return reply{op: opHello, id: req.id, lease: s.cfg.Lease, geo: s.geo}
	}
	if d := s.dedup[req.node]; d != nil && d.id == req.id && d.op == req.op {
		s.stats.duplicates.Add(1)
		return d.reply
	}
	rep := s.apply(req, now)
	if len(s.dedup) == 0 {
		s.dedupNext = now.Add(s.cfg.DedupWindow / 2)
	}
	s.dedup[req.node] = &dedupEntry{id: req.id, op: req.op, reply: rep, at: now}
	return rep
}

// apply carries out a mutating request.
func (s *Server) apply(req *request, now time.Time) reply {
	rep := reply{op: req.op, id: req.id, node: req.node}
	if err := req.validate(); err != nil {
		rep.status = stInvalid
		return rep
	}
	e := s.entries[req.node]
	switch {
	case s.cfg.Membership != nil && req.op != opConnect:
		rep.status = stInvalid // records come from the Membership
	case req.op == opRegister:
		return s.register(req, e, now)
	case req.op == opConnect:
		return s.connectReader(req, now)
	case e == nil:
		rep.status = stNotFound
	case req.op == opRenew:
		lease := e.lease
		if req.lease > 0 {
			lease = s.grant(req.lease)
		}
		s.extend(e, lease, now)
		rep.version, rep.lease = e.version, lease
	case req.op == opDeregister:
		s.remove(e)
	}
	return rep
}

// register stores a record (in place if the node has one) and starts or
// extends its lease. Only changed content gets a new version. A node id
// whose record is live at another fabric address is refused (stInUse):
// taking it would hand the live node's peers to the newcomer, and the
// live node's later Deregister would remove the newcomer's record. The
// same address may replace its record (a node restarted on its device).
func (s *Server) register(req *request, e *entry, now time.Time) reply {
	rep := reply{op: req.op, id: req.id, node: req.node}
	rec := req.rec.content()
	if e != nil && e.rec.Addr != rec.Addr && e.expires.After(now) {
		rep.status = stInUse
		return rep
	}
	e, err := s.store(rec)
	if err != nil {
		rep.status = stTableFull
		return rep
	}
	lease := s.grant(req.lease)
	s.extend(e, lease, now)
	rep.version, rep.lease = e.version, lease
	return rep
}

// store writes rec into the table: in place if its node has a slot (a
// new version only if the content changed), else in a free slot of its
// bucket.
func (s *Server) store(rec Record) (*entry, error) {
	e := s.entries[rec.Node]
	switch {
	case e == nil:
		slot, ver, err := s.tbl.insert(rec)
		if err != nil {
			return nil, err
		}
		e = &entry{node: rec.Node, slot: slot, rec: rec, version: ver}
		s.entries[rec.Node] = e
		s.stats.records.Add(1)
	case e.rec != rec:
		e.rec, e.version = rec, s.tbl.write(e.slot, rec)
	}
	return e, nil
}

// grant is the lease the server gives for a request of lease (0: default).
func (s *Server) grant(lease time.Duration) time.Duration {
	if lease == 0 {
		return s.cfg.Lease
	}
	return min(max(lease, s.cfg.MinLease), s.cfg.MaxLease)
}

// extend restarts e's lease. The heap keeps the old deadline too; expire
// skips it when it finds the lease was extended.
func (s *Server) extend(e *entry, lease time.Duration, now time.Time) {
	e.lease, e.expires = lease, now.Add(lease)
	heap.Push(&s.leases, leaseItem{at: e.expires, e: e})
}

// remove clears e's slot (a new version, so readers see it go) and forgets it.
func (s *Server) remove(e *entry) {
	s.tbl.clear(e.slot)
	delete(s.entries, e.node)
	s.stats.records.Add(-1)
}

// pauseGrace is how late past its deadline the server must wake for the
// time to count as a pause of its own (see postpone), not timer slack.
const pauseGrace = 20 * time.Millisecond

// postpone moves every lease's deadline d later: the server woke d past
// its deadline, so it was not running (its process or host paused: a GC,
// a loaded machine, a stopped VM) and heard no renewal meanwhile. The
// nodes may have been paused with it (one process, one host) or their
// renewals dropped with no receive posted; expiring them on waking would
// take the server's absence for their silence. Shifting every deadline
// alike keeps the heap's order.
func (s *Server) postpone(d time.Duration) {
	for i := range s.leases {
		s.leases[i].at = s.leases[i].at.Add(d)
	}
	for _, e := range s.entries {
		e.expires = e.expires.Add(d)
	}
}

// expire removes records whose lease lapsed: their node stopped renewing,
// so it is presumed dead. It also sweeps the dedup cache.
func (s *Server) expire(now time.Time) {
	for len(s.leases) > 0 && !s.leases[0].at.After(now) {
		it := heap.Pop(&s.leases).(leaseItem)
		if s.entries[it.e.node] == it.e && !it.e.expires.After(now) {
			s.remove(it.e)
			s.stats.expired.Add(1)
		}
	}
	if len(s.dedup) > 0 && !s.dedupNext.After(now) {
		for node, d := range s.dedup {
			if now.Sub(d.at) > s.cfg.DedupWindow {
				delete(s.dedup, node)
			}
		}
		s.dedupNext = now.Add(s.cfg.DedupWindow / 2)
	}
}

// send posts a reply. It never blocks the loop: with no free buffer or no
// address handle the reply is dropped and the client retries.
func (s *Server) send(to verbs.Endpoint, rep *reply) {
	ah := s.ah(to)
	if ah == nil || len(s.txFree) == 0 {
		s.stats.dropped.Add(1)
		return
	}
	i := s.txFree[len(s.txFree)-1]
	s.txFree = s.txFree[:len(s.txFree)-1]
	rep.encode(s.bufMR.Bytes()[s.txOff(i):])
	wr := verbs.SendWR{
		ID: kindSend<<32 | uint64(i), Op: verbs.OpSend, Flags: verbs.Signaled,
		SGL: []verbs.SGE{verbs.SGEOf(s.bufMR, s.txOff(i), replyLen)},
		AH:  ah, RemoteQPN: to.QPN, QKey: s.cfg.QKey,
	}
	if _, err := s.ud.PostSend([]verbs.SendWR{wr}); err != nil {
		s.txFree = append(s.txFree, i)
		s.stats.dropped.Add(1)
		s.udBroken = s.udBroken || errors.Is(err, verbs.ErrQPState)
	}
}

// ah returns a cached address handle for a client's port. The cache is
// bounded; it is emptied when full and no reply is in flight.
func (s *Server) ah(to verbs.Endpoint) verbs.AH {
	to.QPN, to.PSN = 0, 0
	if ah := s.ahs[to]; ah != nil {
		return ah
	}
	if len(s.ahs) >= maxAHs {
		if len(s.txFree) < srvTxCount {
			return nil
		}
		for k, ah := range s.ahs {
			ah.Close()
			delete(s.ahs, k)
		}
	}
	ah, err := s.pd.CreateAH(verbs.AHAttr{Dest: to})
	if err != nil {
		return nil
	}
	s.ahs[to] = ah
	return ah
}

// recoverUD brings the UD QP back after a reply failed (on the soft fabric,
// to a client that vanished), keeping its number, which clients know from
// Info. Its failure already completed all its work; those completions are
// drained first so none is left to retire a slot of the reset queue.
func (s *Server) recoverUD() error {
	s.udBroken = false
	s.stats.resets.Add(1)
	if err := s.ud.Modify(verbs.QPAttr{State: verbs.StateErr}); err != nil {
		return err
	}
	for {
		n, err := s.cq.Poll(s.wcs)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
	}
	if err := s.ud.Modify(verbs.QPAttr{State: verbs.StateReset}); err != nil {
		return err
	}
	return s.readyUD()
}

// leaseItem is a lease deadline to check.
type leaseItem struct {
	at time.Time
	e  *entry
}

// leaseHeap orders lease deadlines, earliest first.
type leaseHeap []leaseItem

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h leaseHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *leaseHeap) Push(x any)        { *h = append(*h, x.(leaseItem)) }
func (h *leaseHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = leaseItem{}
	*h = old[:len(old)-1]
	return it
}
