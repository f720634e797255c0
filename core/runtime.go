package core

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/nonce"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// Config configures a Runtime.
type Config struct {
	// Device is the RNIC the runtime shares. The runtime does not close it.
	Device verbs.Device
	// Node is this node's cluster-wide id (non-zero).
	Node krcore.NodeID
	// Meta lists the MetaServers. Empty starts an embedded MetaServer on
	// Device (see Runtime.MetaInfo), the default for one node or an
	// in-process cluster.
	Meta []meta.Info
	// Membership, if set, is where the cluster's records live (etcd, see
	// package meta/etcdstore): the runtime registers its record there under
	// a lease of Lease, and an embedded MetaServer (Meta empty) mirrors it
	// and reads, after its own, from every other MetaServer it lists.
	// Meta's servers must then mirror the same store. Nil: the runtime
	// registers with the MetaServers themselves.
	Membership meta.Membership
	// MetaBuckets and MetaSlots size the embedded MetaServer's table
	// (meta.ServerConfig's Buckets and Slots; 0: meta's defaults, 1,024 x
	// 4, which fills around a thousand nodes; meta.TableFor sizes one for
	// a cluster). Out of meta.CheckTable's bounds, or set beside Meta
	// (no server is embedded then), they are refused.
	MetaBuckets, MetaSlots int
	// DCIs is the size of the DC initiator pool; default one per core.
	DCIs int
	// Depth is each physical QP's send queue depth, at least 2; default
	// 256.
	Depth int
	// Credits bounds each VQ's outstanding requests; default 128.
	Credits int
	// RCPerPeer (K) and RCPeers (N) bound the RC pool: at most K RC QPs to
	// each of at most N peers. Defaults 1 and 64; RCPeers < 0 disables RC
	// (with DC only).
	RCPerPeer int
	RCPeers   int
	// RCOnly runs the runtime on its RC pool alone, with no DC target and
	// no DC initiators, as it must on a device without DC (New sets it when
	// Device.Attr().DCSupported is false); set it on a DC device to test or
	// compare the mode. Every VQ then travels on an RC QP to its peer,
	// built by Connect when the peer has none (see Queue.Connect).
	RCOnly bool
	// HotOps is how many requests to one peer within HotWindow make the
	// runtime build an RC connection to it; default 4096 per 10ms.
	HotOps    int
	HotWindow time.Duration
	// ColdWindows is how many idle windows evict an RC connection when the
	// pool is over budget; default 100.
	ColdWindows int
	// MaxMessage is the largest two-sided message; default 4096.
	MaxMessage int
	// RecvSlots is the number of receive buffers shared by every port;
	// default 1024.
	RecvSlots int
	// Lease is the MetaServer lease this node renews; default 2s.
	Lease time.Duration
	// Path sets the QPs' timeouts and retries (zero: the provider's).
	Path verbs.Path
	// Logger receives the runtime's events; default slog.Default().
	Logger *slog.Logger
}

func (c *Config) defaults() error {
	if c.Device == nil {
		return fmt.Errorf("core: config needs a Device: %w", verbs.ErrInvalid)
	}
	if c.Node == 0 {
		return fmt.Errorf("core: config needs a non-zero Node id: %w", verbs.ErrInvalid)
	}
	set := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	if err := c.checkMetaTable(); err != nil {
		return err
	}
	c.RCOnly = c.RCOnly || !c.Device.Attr().DCSupported
	if c.RCOnly && c.RCPeers < 0 {
		return fmt.Errorf("core: RC-only mode (no DC) needs the RC pool, but RCPeers is %d: %w", c.RCPeers, verbs.ErrInvalid)
	}
	set(&c.DCIs, runtime.NumCPU())
	set(&c.Depth, 256)
	if c.Depth < 2 {
		return fmt.Errorf("core: config Depth %d: a WRITE_WITH_IMM and its notification take 2 send queue entries: %w", c.Depth, verbs.ErrInvalid)
	}
	set(&c.Credits, 128)
	set(&c.RCPerPeer, 1)
	if c.RCPeers == 0 {
		c.RCPeers = 64
	}
	set(&c.HotOps, 4096)
	set(&c.ColdWindows, 100)
	set(&c.MaxMessage, 4096)
	set(&c.RecvSlots, 1024)
	if err := c.withinDevice(); err != nil {
		return err
	}
	if c.HotWindow <= 0 {
		c.HotWindow = 10 * time.Millisecond
	}
	if c.Lease <= 0 {
		c.Lease = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// checkMetaTable refuses an embedded MetaServer's table meta cannot build,
// and a table size with no embedded server to take it.
func (c *Config) checkMetaTable() error {
	if err := meta.CheckEmbeddedTable(len(c.Meta), c.MetaBuckets, c.MetaSlots); err != nil {
		return fmt.Errorf("core: config MetaBuckets, MetaSlots: %w: %w", err, verbs.ErrInvalid)
	}
	return nil
}

// withinDevice refuses sizes the device cannot give (ErrLimit), naming
// the field: a VQ's Credits size its completion ring (4 per credit), so
// an unbounded one would make Queue allocate without bound; the others
// size QPs, the SRQ and receive slots the device would refuse anyway,
// perhaps after allocating for them.
func (c *Config) withinDevice() error {
	a := c.Device.Attr()
	for _, f := range []struct {
		name   string
		v, max int
	}{
		{"DCIs", c.DCIs, a.MaxQP}, {"Depth", c.Depth, a.MaxQPWR}, {"Credits", c.Credits, a.MaxQPWR},
		{"RCPerPeer", c.RCPerPeer, a.MaxQP}, {"RecvSlots", c.RecvSlots, a.MaxSRQWR}, {"MaxMessage", c.MaxMessage, int(a.MaxMsgSize)},
	} {
		if f.max > 0 && f.v > f.max {
			return fmt.Errorf("core: config %s %d exceeds the device's %d: %w", f.name, f.v, f.max, verbs.ErrLimit)
		}
	}
	return nil
}

type counters struct {
	connects, coldConnects, refusals, recoveries, postErrors atomic.Uint64
	rcBuilt, rcEvicted, migrations, staleTargets, dropped    atomic.Uint64
	peersDead                                                atomic.Uint64
	writeImms                                                atomic.Uint64
}

// Runtime is KRCore on one node: it owns the shared QPs (a DC target, a
// pool of DC initiators, an RC pool; the RC pool alone in RC-only mode),
// the virtual-queue table and the meta cache, and serves every VQ of the
// process.
type Runtime struct {
	cfg    Config
	routes strategy // DC with RC for hot peers, or RC alone (Config.RCOnly)
	dev    verbs.Device
	node   krcore.NodeID
	log    *slog.Logger
	pd     verbs.PD
	sends  *poller // completions of every physical QP's sends
	recvs  *poller // completions of the shared receive queue
	srq    verbs.SRQ
	dct    verbs.QP
	dcKey  uint64
	lim    limits
	dcis   []*pqp
	recv   *receiver
	meta   *meta.Client
	own    *meta.Server // the embedded MetaServer, if this runtime started it
	lease  meta.Lease   // the node's record in cfg.Membership, if any
	metas  []meta.Info  // the MetaServers the meta client reads, in order
	stats  counters

	// readied counts kicks that woke a goroutine asleep on a queue (see
	// sleepOnCQ).
	readied atomic.Uint64

	// dc: routes is dcRC, whose peers are always routable; Push tests it
	// before asking routes (a dynamic call per request).
	dc   bool
	rest rester // serveRecvs's rests off the receive queue

	byQPN atomic.Pointer[map[uint32]*pqp]
	qpnMu sync.Mutex // serializes byQPN updates
	// portView is a copy of ports, replaced at each Bind and Unbind, that
	// the receive path reads without rt.mu (a read lock is two atomic
	// adds on a line every core shares, at every message).
	portView atomic.Pointer[map[uint32]*Queue]

	mu      sync.RWMutex // guards the maps below and closed
	queues  map[uint32]*Queue
	nextQ   uint32
	ports   map[uint32]*Queue
	peers   map[krcore.NodeID]*peer
	exports map[string]*export
	mrs     map[*MR]struct{} // registered and not released: Close releases them
	closed  bool

	ahMu sync.Mutex
	ahs  map[portKey]verbs.AH // by remote port

	poolMu sync.Mutex // RC-only mode: serializes RC budget decisions (see reserve)

	ctrl *control
	stop chan struct{}
	wg   sync.WaitGroup
}

// New starts a runtime on cfg.Device and registers the node with the
// MetaServers.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	rt := &Runtime{
		cfg: cfg, dev: cfg.Device, node: cfg.Node, log: cfg.Logger.With("node", cfg.Node),
		lim:    limits{maxMsg: uint64(cfg.Device.Attr().MaxMsgSize)},
		queues: make(map[uint32]*Queue), ports: make(map[uint32]*Queue), peers: make(map[krcore.NodeID]*peer),
		exports: make(map[string]*export), mrs: make(map[*MR]struct{}), stop: make(chan struct{}), ahs: make(map[portKey]verbs.AH),
	}
	rt.rest.nudge = make(chan struct{}, 1)
	rt.routes = newStrategy(rt)
	_, rt.dc = rt.routes.(dcRC)
	empty := map[uint32]*pqp{}
	rt.byQPN.Store(&empty)
	if err := rt.setup(ctx); err != nil {
		rt.teardown()
		return nil, fmt.Errorf("core: start node %d: %w", cfg.Node, err)
	}
	rt.wg.Add(2)
	go rt.manage()
	go rt.serveRecvs()
	return rt, nil
}

// setup creates the shared QPs and the control QP and joins the
// MetaServers.
func (rt *Runtime) setup(ctx context.Context) error {
	var err error
	if rt.pd, err = rt.dev.AllocPD(); err != nil {
		return err
	}
	c := &rt.cfg
	if rt.sends, err = newPoller(rt, (c.DCIs+c.RCPerPeer*max(c.RCPeers, 0)*2)*c.Depth+1024); err != nil {
		return err
	}
	if rt.recvs, err = newPoller(rt, c.RecvSlots+1024); err != nil {
		return err
	}
	rt.recvs.own = &Queue{rt: rt} // see serveRecvs
	if rt.srq, err = rt.pd.CreateSRQ(verbs.SRQInit{MaxWR: c.RecvSlots, MaxSGE: 1}); err != nil {
		return err
	}
	if err := rt.routes.setup(); err != nil {
		return err
	}
	if rt.recv, err = newReceiver(rt); err != nil {
		return err
	}
	if rt.ctrl, err = newControl(rt); err != nil {
		return err
	}
	return rt.joinMeta(ctx)
}

// setupDC creates the DC target peers reach this node through and the DCI
// pool.
func (rt *Runtime) setupDC() error {
	var err error
	rt.dcKey = nonce.Uint64() | 1
	if rt.dct, err = rt.pd.CreateQP(verbs.QPInit{Type: verbs.DCT, SendCQ: rt.sends.cq, RecvCQ: rt.recvs.cq, SRQ: rt.srq, DCKey: rt.dcKey}); err != nil {
		return err
	}
	if err = verbs.Ready(rt.dct, rt.cfg.Path); err != nil {
		return err
	}
	for i := 0; i < rt.cfg.DCIs; i++ {
		p, err := rt.newDCI()
		if err != nil {
			return err
		}
		rt.dcis = append(rt.dcis, p)
	}
	return nil
}

func (rt *Runtime) newDCI() (*pqp, error) {
	qp, err := rt.pd.CreateQP(verbs.QPInit{Type: verbs.DCI, SendCQ: rt.sends.cq, RecvCQ: rt.recvs.cq,
		Cap: verbs.QPCap{MaxSendWR: rt.cfg.Depth, MaxSendSGE: 2}})
	if err != nil {
		return nil, err
	}
	if err := verbs.Ready(qp, rt.cfg.Path); err != nil {
		qp.Close()
		return nil, err
	}
	p, err := newPQP(rt, qp, rt.cfg.Depth, nil)
	if err != nil {
		qp.Close()
		return nil, err
	}
	rt.addPQP(p)
	return p, nil
}

// joinMeta starts the embedded MetaServer when none is configured and
// registers this node's record: its DC target (none in RC-only mode) and
// its control QP. In RC-only mode the meta client READs over RC and the
// embedded server has no DCT.
func (rt *Runtime) joinMeta(ctx context.Context) error {
	infos := rt.cfg.Meta
	srvCfg, cliCfg := rt.routes.metaConfig()
	if len(infos) == 0 {
		srvCfg.Membership, srvCfg.Buckets, srvCfg.Slots = rt.cfg.Membership, rt.cfg.MetaBuckets, rt.cfg.MetaSlots
		srv, err := meta.NewServer(rt.dev, srvCfg)
		if err != nil {
			return fmt.Errorf("embedded MetaServer: %w", err)
		}
		rt.own = srv
		infos = rt.listedServers(ctx, []meta.Info{srv.Info()})
	}
	mc, err := meta.NewClient(rt.dev, infos, cliCfg)
	if err != nil {
		return err
	}
	rt.meta, rt.metas = mc, infos
	port := rt.dev.Port()
	rec := meta.Record{Node: rt.node, Addr: port.Addr, GID: port.GID, LID: port.LID, CtrlQPN: rt.ctrl.ep.QPN(), CtrlQKey: rt.ctrl.qkey}
	if rt.dct != nil {
		rec.DCTNum, rec.DCKey = rt.dct.Num(), rt.dcKey
	}
	return rt.register(ctx, rec)
}

// MetaInfo is the MetaServer other nodes should use: the embedded one if
// this runtime started it, else the first configured.
func (rt *Runtime) MetaInfo() meta.Info {
	if rt.own != nil {
		return rt.own.Info()
	}
	return rt.cfg.Meta[0]
}

// Node is this runtime's node id.
func (rt *Runtime) Node() krcore.NodeID { return rt.node }

// RegMR allocates and registers size bytes of off-heap memory.
func (rt *Runtime) RegMR(size int, access verbs.Access) (*MR, error) {
	if err := rt.closedErr("register"); err != nil {
		return nil, err
	}
	if max := rt.dev.Attr().MaxMRSize; size <= 0 || uint64(size) > max {
		return nil, fmt.Errorf("core: register %d bytes (max %d): %w", size, max, verbs.ErrInvalid)
	}
	blk, err := offheap.Alloc(size)
	if err != nil {
		return nil, err
	}
	m, err := rt.Register(blk.Bytes(), access)
	if err != nil {
		blk.Close()
		return nil, err
	}
	m.blk = blk
	return m, nil
}

// Register registers caller-owned off-heap memory (from package offheap).
// The runtime keeps the MR until Deregister, or until Close releases it.
func (rt *Runtime) Register(buf []byte, access verbs.Access) (*MR, error) {
	if err := rt.closedErr("register"); err != nil {
		return nil, err
	}
	mr, err := rt.pd.RegMR(buf, access)
	if err != nil {
		return nil, fmt.Errorf("core: register %d bytes: %w", len(buf), err)
	}
	m := &MR{mr: mr, rt: rt, access: access, addr: mr.Addr(), lkey: mr.LKey(), n: mr.Len(), mem: mr.Bytes()}
	rt.mu.Lock()
	closed := rt.closed
	if !closed {
		rt.mrs[m] = struct{}{}
	}
	rt.mu.Unlock()
	if closed { // Close began meanwhile and will not see m
		mr.Close()
		return nil, fmt.Errorf("core: register: runtime: %w", krcore.ErrClosed)
	}
	return m, nil
}

// closedErr is ErrClosed, naming what, once Close has begun.
func (rt *Runtime) closedErr(what string) error {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	if rt.closed {
		return fmt.Errorf("core: %s: runtime: %w", what, krcore.ErrClosed)
	}
	return nil
}

// forget drops a released MR from the set Close releases.
func (rt *Runtime) forget(m *MR) {
	rt.mu.Lock()
	delete(rt.mrs, m)
	rt.mu.Unlock()
}

// releaseAll revokes every export and releases every MR still registered,
// once the QPs that could touch them are gone: a closed runtime leaves
// nothing registered and no memory of RegMR's allocated. A Deregister of
// one of them afterwards fails with ErrClosed.
func (rt *Runtime) releaseAll() {
	rt.mu.Lock()
	exps := make([]*export, 0, len(rt.exports))
	for name, e := range rt.exports {
		exps = append(exps, e)
		delete(rt.exports, name)
	}
	mrs := make([]*MR, 0, len(rt.mrs))
	for m := range rt.mrs {
		mrs = append(mrs, m)
	}
	rt.mu.Unlock()
	for _, e := range exps {
		e.revoke()
	}
	for _, m := range mrs {
		m.dead.Store(true)
		m.release()
	}
}

// Deregister releases an MR from RegMR or Register. From now on the
// runtime refuses requests and receive buffers naming it, and remote
// operations on regions exported from it fail with REM_ACCESS_ERR. Its
// requests already on a shared QP (perhaps behind other VQs' requests)
// keep it: pulling the registration from under them would fail them on
// the QP and break it for everyone. So Deregister waits, polling, until
// they finish (within 2x the retry timeout: each either completes or times
// out by then), then deregisters the memory and frees what RegMR
// allocated. If some are still in flight then, it returns an error
// wrapping verbs.ErrBusy and the last of them releases the MR.
func (rt *Runtime) Deregister(h krcore.MR) error {
	m := rt.ownMR(h)
	if m == nil {
		return fmt.Errorf("core: deregister an MR of another runtime: %w", krcore.ErrRefused)
	}
	if m.dead.Swap(true) {
		return fmt.Errorf("core: deregister: %w", krcore.ErrClosed)
	}
	rt.unexportMR(m)
	rt.dropUses(m)
	if err := rt.drain(m); err != nil {
		m.deferred.Store(true)
		if m.uses.Load() == 0 { // the last use went as we gave up
			return m.release()
		}
		return fmt.Errorf("core: deregister: %d requests still use the MR (%v); released when they finish: %w", m.uses.Load(), err, verbs.ErrBusy)
	}
	return m.release()
}

// drain waits until no request or receive buffer uses m (dead), polling
// the send completions itself, for at most twice the retry timeout.
func (rt *Runtime) drain(m *MR) error {
	if m.uses.Load() == 0 {
		return nil
	}
	w := &Queue{rt: rt} // a stand-in for the waiter, as serveRecvs's
	m.drained.Store(w)
	ctx, cancel := context.WithTimeout(context.Background(), 2*rt.retryTimeout())
	defer cancel()
	return rt.sends.wait(ctx, w, func() bool { return m.uses.Load() == 0 }, nil)
}

func (rt *Runtime) count(c *atomic.Uint64) { c.Add(1) }

// Stats reports the runtime's counters.
func (rt *Runtime) Stats() krcore.Stats {
	s := &rt.stats
	rt.mu.Lock()
	vqs := len(rt.queues)
	rcs := 0
	for _, p := range rt.peers {
		rcs += len(p.rcs())
	}
	rt.mu.Unlock()
	return krcore.Stats{
		Connects: s.connects.Load(), ColdConnects: s.coldConnects.Load(), Refusals: s.refusals.Load(),
		Recoveries: s.recoveries.Load(), PostErrors: s.postErrors.Load(), RCBuilt: s.rcBuilt.Load(),
		RCEvicted: s.rcEvicted.Load(), Migrations: s.migrations.Load(), StaleTargets: s.staleTargets.Load(), PeersDead: s.peersDead.Load(),
		Dropped: s.dropped.Load(), WriteImms: s.writeImms.Load(), DCIs: len(rt.dcis), RCs: rcs, VQs: vqs, RCOnly: rt.cfg.RCOnly,
	}
}

// MetaStats reports the meta cache's hits and misses.
func (rt *Runtime) MetaStats() meta.ClientStats { return rt.meta.Stats() }

// MetaEntries is a snapshot of the meta cache: the record of every node
// the runtime looked up and still trusts, one entry per node (see
// meta.Client.Entries).
func (rt *Runtime) MetaEntries() []meta.CacheEntry { return rt.meta.Entries() }

func (rt *Runtime) addPQP(p *pqp) {
	rt.qpnMu.Lock()
	defer rt.qpnMu.Unlock()
	old := *rt.byQPN.Load()
	m := make(map[uint32]*pqp, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[p.qp.Num()] = p
	rt.byQPN.Store(&m)
}

func (rt *Runtime) removePQP(p *pqp) {
	rt.qpnMu.Lock()
	defer rt.qpnMu.Unlock()
	old := *rt.byQPN.Load()
	m := make(map[uint32]*pqp, len(old))
	for k, v := range old {
		if v != p {
			m[k] = v
		}
	}
	rt.byQPN.Store(&m)
}

// Close fails every outstanding request (WR_FLUSH_ERR, for Pop to return),
// deregisters the node and releases every shared QP.
func (rt *Runtime) Close() error {
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		return fmt.Errorf("core: runtime: %w", krcore.ErrClosed)
	}
	rt.closed = true
	qs := make([]*Queue, 0, len(rt.queues))
	for _, q := range rt.queues {
		qs = append(qs, q)
	}
	rt.mu.Unlock()
	close(rt.stop)
	rt.sends.wakeAll()
	rt.recvs.wakeAll()
	rt.ctrl.ep.Shutdown() // wakes control calls and the serving goroutine
	for _, q := range qs {
		q.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rt.deregister(ctx)
	rt.wg.Wait()
	rt.teardown()
	return nil
}

// stopped reports whether Close has begun.
func (rt *Runtime) stopped() bool {
	select {
	case <-rt.stop:
		return true
	default:
		return false
	}
}

// teardown releases whatever setup created.
func (rt *Runtime) teardown() {
	if rt.meta != nil {
		rt.meta.Close()
	}
	if rt.own != nil {
		rt.own.Close()
	}
	rt.mu.Lock()
	peers := make([]*peer, 0, len(rt.peers))
	for _, p := range rt.peers {
		peers = append(peers, p)
	}
	rt.mu.Unlock()
	for _, p := range peers {
		p.close()
	}
	if rt.ctrl != nil {
		rt.ctrl.ep.Close()
	}
	rt.ahMu.Lock()
	for _, ah := range rt.ahs {
		ah.Close()
	}
	rt.ahMu.Unlock()
	for _, p := range rt.dcis {
		p.destroy()
	}
	if rt.dct != nil {
		rt.dct.Close()
	}
	if rt.recv != nil {
		rt.recv.close()
	}
	if rt.srq != nil {
		rt.srq.Close()
	}
	for _, pl := range []*poller{rt.sends, rt.recvs} {
		if pl != nil {
			pl.cq.Close()
		}
	}
	rt.releaseAll()
	if rt.pd != nil {
		rt.pd.Close()
	}
}
