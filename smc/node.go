package smc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/nonce"
	"github.com/krcore/krcore/internal/poprole"
	"github.com/krcore/krcore/verbs"
)

// Buffer sizes when NodeOptions.BufferSize is 0: they adapt. A
// connection starts with receive and staging buffers of
// DefaultBufferSize, or MinBufferSize once a quarter of the Node's
// memory bound is taken (many connections, each small); a receiver whose
// peer waits for window again and again (bulk) moves to a buffer four
// times larger, up to NodeOptions.MaxBufferSize, while the bound allows.
// A stream's window must cover what the link carries while a cursor
// update crosses back: through krcored an update takes milliseconds, so
// the default maximum is 4 MiB, though past 1 MiB a buffer grows only
// for a writer whose waits for window are that long (lagBuffer); such a
// connection holds 4 MiB at the receiver and as much staging at the
// writer, within MaxMemory.
const (
	DefaultBufferSize    = 64 << 10
	MinBufferSize        = 16 << 10
	DefaultMaxBufferSize = 4 << 20
	// maxBuffer bounds any buffer, ours or one a peer names.
	maxBuffer = 1 << 30
	// DefaultMaxMemory bounds the registered buffer memory (receive and
	// staging) of a Node when NodeOptions.MaxMemory is 0.
	DefaultMaxMemory = 256 << 20
)

// A slab is registered memory for slabElems buffers (grown ones: at most
// slabBytes, or one): a node registers and exports memory a slab at a
// time, so that later connections take an element of a slab a peer
// already knows.
const (
	slabElems = 16
	slabBytes = 1 << 20
)

// portBase is where Open looks for a free port when NodeOptions.Port is 0
// ("SM" in the high bytes, below the reserved top bit).
const portBase = 0x534d0000

// NodeOptions configure a Node.
type NodeOptions struct {
	// Port is the port the Node binds for its connections' notifications
	// and CDC messages; 0 picks a free one.
	Port uint32
	// BufferSize fixes each connection's receive buffer and send staging
	// buffer, in bytes, from MinBufferSize to 1 GiB as Options.BufferSize;
	// 0 adapts them (DefaultBufferSize). Open refuses other sizes
	// (ErrInvalid).
	BufferSize int
	// MaxBufferSize bounds an adapting buffer; 0 is DefaultMaxBufferSize.
	MaxBufferSize int
	// MaxMemory bounds the Node's registered buffer memory, receive and
	// staging; 0 is DefaultMaxMemory. A connection that finds no room
	// falls back to TCP (ReasonMem), and a buffer does not grow past it.
	MaxMemory int
	// ReportEvery is how often a Node through krcored (an API with a
	// Report method, client.Client) reports its connections and counters
	// to the daemon, for krctl smc and krcored's /metrics; 0 is
	// DefaultReportEvery, negative never. An embedded runtime has no
	// daemon: Node.Report, Stats and Conns give the same.
	ReportEvery time.Duration
}

// Node is a process's SMC endpoint on a krcore runtime: the port its
// connections' peers notify, the registered memory their buffers come
// from, and the regions of peers it learned. Pass it to Listen and Dial in
// Options.Node. Its methods are safe for concurrent use.
type Node struct {
	api  krcore.API
	port uint32
	id   uint64 // this instance, the Peer ID of RFC 7609
	// Buffer sizes: a connection starts at startSize (or minSize when
	// memory is short) and its receive buffer grows up to maxSize; all
	// three are equal when NodeOptions.BufferSize fixes them.
	startSize, minSize, maxSize int
	mem                         *budget

	srv    krcore.VQ // bound to port; popped by whoever holds pop
	pop    popRole
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup // the connections' goroutines and report's

	stages map[int]*bufPool // send staging buffers by ring size, local only; under mu

	lookMu sync.Mutex // srv's Connect and Region: lookups ask as srv's port

	mu      sync.Mutex
	closed  bool
	conns   map[uint32]*Conn // SMC connections by token
	all     map[*Conn]uint64 // every open connection: its serial (track)
	serial  uint64
	rmbs    map[rmbKey]*bufPool                 // receive buffers, per peer endpoint and size
	queues  map[krcore.Principal][]*sharedQueue // connected to a peer endpoint; nil once closed
	regions map[regionKey]*learned
	idle    []idleRegion // moved regions unused, oldest first; some stale
	idleSeq uint64
	idleN   int // regions in idle that are idle still

	// claimMu guards claims: per peer region, the parts of it the
	// Node's connections WRITE into (claimPeer). Taken without c.mu held;
	// it takes the mu of the connections it checks.
	claimMu sync.Mutex
	claims  map[regionKey][]peerSpan

	reapKick chan struct{} // a request was pushed: wakes reaper

	dropped atomic.Uint64 // notifications and messages naming no connection
	stats   counters
}

// counters are a Node's Stats; fallbacks under Node.mu.
type counters struct {
	smc, lookups, sent, received, writes, cdcs, grows, shrinks atomic.Uint64
	fallbacks                                                  map[Reason]uint64
}

// Stats counts what a Node's connections did.
type Stats struct {
	// SMC is the connections that settled on SMC; Fallbacks those that
	// fell back to TCP, by reason.
	SMC       uint64
	Fallbacks map[Reason]uint64
	// Slabs is the registered slabs of receive buffers; Lookups
	// the lookups of peers' slabs (a connection whose peer's buffer is in
	// a slab already known needs none).
	Slabs   int
	Lookups uint64
	// Memory is the registered buffer memory, receive and staging, in
	// bytes (bounded by NodeOptions.MaxMemory); Grows and Shrinks count
	// the receive buffers offered to peers to move to, larger for a
	// stream and smaller for an idle connection.
	Memory         int64
	Grows, Shrinks uint64
	// BytesSent and BytesReceived count the data carried over SMC; Writes
	// the RDMA WRITE_WITH_IMMs that carried it; CursorMsgs the CDC
	// messages sent (window updates and close flags).
	BytesSent, BytesReceived, Writes, CursorMsgs uint64
	// Dropped counts notifications and messages that named no connection
	// of this Node or came from another node than its peer's.
	Dropped uint64
}

// Stats reports the Node's counters.
func (n *Node) Stats() Stats {
	s := Stats{SMC: n.stats.smc.Load(), Lookups: n.stats.lookups.Load(), BytesSent: n.stats.sent.Load(),
		BytesReceived: n.stats.received.Load(), Writes: n.stats.writes.Load(), CursorMsgs: n.stats.cdcs.Load(),
		Dropped: n.dropped.Load(), Memory: n.mem.used.Load(),
		Grows: n.stats.grows.Load(), Shrinks: n.stats.shrinks.Load(), Fallbacks: map[Reason]uint64{}}
	n.mu.Lock()
	for r, k := range n.stats.fallbacks {
		s.Fallbacks[r] = k
	}
	n.mu.Unlock()
	for _, p := range n.pools() {
		p.mu.Lock()
		s.Slabs += len(p.slabs)
		p.mu.Unlock()
	}
	return s
}

// settled counts a connection's mode.
func (n *Node) settled(m Mode) {
	if m.SMC {
		n.stats.smc.Add(1)
		return
	}
	n.mu.Lock()
	if n.stats.fallbacks == nil {
		n.stats.fallbacks = map[Reason]uint64{}
	}
	n.stats.fallbacks[m.Reason]++
	n.mu.Unlock()
}

type rmbKey struct {
	peer    krcore.Principal
	size    int
	dialled bool
}

type regionKey struct {
	node krcore.NodeID
	name string
}

// Open starts api's SMC endpoint: it binds a port and serves the
// notifications and CDC messages of its connections until Close.
func Open(api krcore.API, opts NodeOptions) (*Node, error) {
	if api == nil {
		return nil, fmt.Errorf("smc: open: nil API: %w", krcore.ErrInvalid)
	}
	n := &Node{api: api, id: rand.Uint64(), done: make(chan struct{}), reapKick: make(chan struct{}, 1),
		conns: map[uint32]*Conn{}, all: map[*Conn]uint64{}, claims: map[regionKey][]peerSpan{}, regions: map[regionKey]*learned{},
		rmbs: map[rmbKey]*bufPool{}, stages: map[int]*bufPool{}, queues: map[krcore.Principal][]*sharedQueue{}}
	if err := n.sizes(opts); err != nil {
		return nil, fmt.Errorf("smc: open: %w", err)
	}
	q, err := api.Queue()
	if err != nil {
		return nil, fmt.Errorf("smc: open: %w", err)
	}
	n.srv = q
	if err := n.bind(opts.Port); err != nil {
		q.Close()
		return nil, fmt.Errorf("smc: open: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.ctx, n.cancel = ctx, cancel
	n.pop.Role = poprole.NewPatient()
	go n.serve(ctx)
	n.wg.Add(1)
	go n.reaper(ctx)
	if r, ok := api.(reporter); ok && opts.ReportEvery >= 0 {
		every := opts.ReportEvery
		if every == 0 {
			every = DefaultReportEvery
		}
		n.wg.Add(1)
		go n.report(ctx, r, every)
	}
	return n, nil
}

// sizes sets the Node's buffer sizes and memory bound from opts.
func (n *Node) sizes(opts NodeOptions) error {
	if err := checkSize(opts.BufferSize); err != nil {
		return err
	}
	n.startSize, n.minSize, n.maxSize = opts.BufferSize, opts.BufferSize, opts.BufferSize
	if opts.BufferSize == 0 {
		n.startSize, n.minSize, n.maxSize = DefaultBufferSize, MinBufferSize, opts.MaxBufferSize
		if n.maxSize == 0 {
			n.maxSize = DefaultMaxBufferSize
		}
	}
	mem := opts.MaxMemory
	if mem == 0 {
		mem = DefaultMaxMemory
	}
	if n.maxSize < n.startSize || n.maxSize > maxBuffer || mem < 0 {
		return fmt.Errorf("buffer size %d, max %d, memory %d: %w", opts.BufferSize, opts.MaxBufferSize, opts.MaxMemory, krcore.ErrInvalid)
	}
	n.mem = &budget{max: int64(mem)}
	return nil
}

// firstSize is a new connection's buffer size: the start size while less
// than a quarter of the memory bound is taken, else the minimum, so that
// many connections take little each.
func (n *Node) firstSize() int {
	if n.mem.used.Load() < n.mem.max/4 {
		return n.startSize
	}
	return n.minSize
}

// bind takes port, or the first free port from a random place above
// portBase.
func (n *Node) bind(port uint32) error {
	if port != 0 {
		n.port = port
		return n.srv.Bind(port)
	}
	start := rand.Uint32N(1 << 16)
	for i := range uint32(256) {
		p := portBase + (start+i)%(1<<16)
		err := n.srv.Bind(p)
		if err == nil {
			n.port = p
			return nil
		}
		if !errors.Is(err, krcore.ErrPortInUse) {
			return err
		}
	}
	return fmt.Errorf("bind: no free port near %#x: %w", portBase, krcore.ErrPortInUse)
}

// Port is the port the Node is bound to.
func (n *Node) Port() uint32 { return n.port }

// Close stops the endpoint: its connections fail with net.ErrClosed, and
// their buffers and the Node's memory are released. The API stays open.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	conns := slices.Collect(maps.Values(n.conns))
	n.mu.Unlock()
	for _, c := range conns {
		c.fail(fmt.Errorf("smc: node closed: %w", errAborted))
		c.Close()
	}
	n.mu.Lock()
	queues := n.queues
	n.queues = nil
	n.mu.Unlock()
	for _, qs := range queues {
		for _, s := range qs {
			s.q.Close()
		}
	}
	n.cancel()
	n.srv.Close()
	<-n.done
	n.wg.Wait()
	for _, p := range n.pools() {
		p.close()
	}
	n.mu.Lock()
	stages := slices.Collect(maps.Values(n.stages))
	for k, l := range n.regions {
		krcore.Forget(l.r)
		delete(n.regions, k)
	}
	n.mu.Unlock()
	for _, p := range stages {
		p.close()
	}
	return nil
}

// abortAll fails every SMC connection of the Node, whose port can no
// longer hear their peers: a reader would otherwise wait for data that
// cannot arrive. Their TCP connections stay for the application to close.
func (n *Node) abortAll(cause error) {
	n.mu.Lock()
	conns := slices.Collect(maps.Values(n.conns))
	n.mu.Unlock()
	for _, c := range conns {
		c.fail(fmt.Errorf("smc: the Node's runtime failed (%v): %w", cause, errAborted))
	}
}

// dispatch hands one message to its connection. A WRITE_WITH_IMM's
// immediate is the token; a CDC message names it inside. Anything from a
// node other than the connection's peer is dropped.
func (n *Node) dispatch(m *krcore.Message) {
	if m.Write {
		if c := n.conn(m.Imm); c != nil && c.onData(m.From, m.Len) {
			return
		}
		n.dropped.Add(1)
		return
	}
	data := m.Data
	if m.Buf != nil {
		data = m.Buf.MR.Bytes()[m.Buf.Off : m.Buf.Off+m.Len]
	}
	if len(data) > 0 && data[0] == moveType {
		if mv, err := decodeMove(data); err == nil {
			if c := n.conn(mv.token); c != nil && c.onMove(m.From, mv) {
				return
			}
		}
		n.dropped.Add(1)
		return
	}
	msg, ok := decodeCDC(data)
	if ok {
		if c := n.conn(msg.token); c != nil && c.onCDC(m.From, msg) {
			return
		}
	}
	n.dropped.Add(1)
}

func (n *Node) conn(token uint32) *Conn {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.conns[token]
}

// register gives c a token, so that its peer's notifications reach it.
// A token is drawn from crypto/rand for each connection: it is all a
// WRITE_WITH_IMM's notification names (the immediate's 32 bits), so a
// process that could guess it (as it could a counter another connection
// showed it) could move the connection's producer cursor by having the
// peer, or another process on the peer's node, WRITE with it.
func (n *Node) register(c *Conn) (uint32, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return 0, fmt.Errorf("smc: node closed: %w", krcore.ErrClosed)
	}
	for {
		if t := nonce.Uint32(); t != 0 && n.conns[t] == nil {
			n.conns[t] = c
			return t, nil
		}
	}
}

// peerSpan is the part of a peer's region (off, size) a connection
// WRITEs into.
type peerSpan struct {
	c         *Conn
	off, size uint64
}

// errPeerSpanTaken: a CLC message or a move offer named a part of the
// peer's region that another connection of this Node may still WRITE
// into.
var errPeerSpanTaken = errors.New("smc: another connection writes into that part of the peer's buffer")

// claimPeer records that c WRITEs into size bytes at off of the peer's
// region k, unless another connection of the Node may still WRITE into a
// part of them. A peer's slab is exported to this Node's port alone, so
// every WRITE into it comes from one of these connections, and the peer
// hands an element to one connection at a time, after the last one said
// it writes no more. Two connections naming the same bytes is so a
// forgery: a TCP client that names another's buffer in its confirm, or a
// server in its accept, to have this Node WRITE its connection's bytes
// into the other's stream.
func (n *Node) claimPeer(c *Conn, k regionKey, off, size uint64) error {
	n.claimMu.Lock()
	defer n.claimMu.Unlock()
	for _, s := range n.claims[k] {
		if s.c != c && s.off < off+size && off < s.off+s.size && s.c.mayWrite() {
			return fmt.Errorf("%w: %d bytes at %d of %s", errPeerSpanTaken, size, off, k.name)
		}
	}
	n.claims[k] = append(n.claims[k], peerSpan{c: c, off: off, size: size})
	return nil
}

// unclaimPeer ends c's claim of the part at off of the peer's region k.
func (n *Node) unclaimPeer(c *Conn, k regionKey, off uint64) {
	n.claimMu.Lock()
	defer n.claimMu.Unlock()
	spans := slices.DeleteFunc(n.claims[k], func(s peerSpan) bool { return s.c == c && s.off == off })
	if len(spans) == 0 {
		delete(n.claims, k)
		return
	}
	n.claims[k] = spans
}

func (n *Node) unregister(token uint32) {
	n.mu.Lock()
	delete(n.conns, token)
	n.mu.Unlock()
}

// learned is a peer's region the Node looked up, and how many
// connections WRITE into it. moved: it was learned for a buffer a peer
// offered mid-stream (a grown or shrunk one), which the peer releases
// once its connections are done with it.
type learned struct {
	r     krcore.Region
	users int
	moved bool
	idle  uint64 // when users fell to 0, for a moved one (Node.idle)
}

// idleRegions bounds the regions learned for buffers offered mid-stream
// that a Node keeps with no connection using them: a peer keeps a spare
// slab of grown buffers, which the next stream to grow gets, so the
// latest are worth keeping; its peers release the others, and their names
// are never reused, so a Node that kept them all would collect one for
// every slab its peers released.
const idleRegions = 8

// idleRegion is a moved region no connection uses, in the order they
// became idle.
type idleRegion struct {
	k   regionKey
	seq uint64
}

// region returns node's region name for a connection to WRITE into,
// learned once per node and name: a later connection to the same node
// whose buffer is in a slab already known costs no lookup. moved says
// the buffer was offered mid-stream (moveMsg). The connection gives it
// back with putRegion.
func (n *Node) region(ctx context.Context, node krcore.NodeID, name string, moved bool) (krcore.Region, error) {
	k := regionKey{node, name}
	if r := n.useRegion(k, nil, moved); r != nil {
		return r, nil
	}
	n.stats.lookups.Add(1)
	n.lookMu.Lock()
	err := n.srv.Connect(ctx, node, nil)
	var r krcore.Region
	if err == nil {
		r, err = n.srv.Region(ctx, name)
	}
	n.lookMu.Unlock()
	if err != nil {
		return nil, err
	}
	return n.useRegion(k, r, moved), nil
}

// useRegion counts a user of the region k, learned already or now (r),
// and returns it; nil when k is not known and r is nil. A region learned
// at a connect stays cached for later connections whatever it was first
// learned for.
func (n *Node) useRegion(k regionKey, r krcore.Region, moved bool) krcore.Region {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.regions[k]
	switch {
	case l == nil && r == nil:
		return nil
	case l == nil:
		l = &learned{r: r, moved: moved}
		n.regions[k] = l
	case r != nil && r != l.r: // learned twice at once: one is kept
		krcore.Forget(r)
	}
	if l.users == 0 && l.idle != 0 {
		l.idle = 0
		n.idleN--
	}
	l.users++
	l.moved = l.moved && moved
	return l.r
}

// putRegion is a connection's end of WRITEing into node's region name. A
// region learned for a buffer offered mid-stream that no connection uses
// joins the idle ones, of which the Node forgets the oldest past
// idleRegions.
func (n *Node) putRegion(node krcore.NodeID, name string) {
	k := regionKey{node, name}
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.regions[k]
	if l == nil || l.users <= 0 {
		return
	}
	if l.users--; l.users > 0 || !l.moved {
		return
	}
	n.idleSeq++
	l.idle = n.idleSeq
	n.idle = append(n.idle, idleRegion{k, l.idle})
	n.idleN++
	for n.idleN > idleRegions {
		old := n.idle[0]
		n.idle = n.idle[1:]
		if o := n.regions[old.k]; o != nil && o.idle == old.seq {
			delete(n.regions, old.k)
			n.idleN--
			krcore.Forget(o.r) // it does not wait for krcored: fine under n.mu
		}
	}
	if len(n.idle) > 4*idleRegions { // stale entries of regions used again
		n.idle = slices.DeleteFunc(n.idle, func(e idleRegion) bool {
			o := n.regions[e.k]
			return o == nil || o.idle != e.seq
		})
	}
}

// queuesPerPeer bounds the queues a Node connects to one peer endpoint:
// connections share them, so that many connections cost no queue each
// (krcored bounds a client's queues) and a later connection none at all.
const queuesPerPeer = 4

// queue returns a queue connected to peer's port: an unused one when
// there is one, a new one while fewer than queuesPerPeer are connected,
// else the least used. Through krcored a new queue and its connect cost
// two round trips to the daemon; with wait false, a queue that would be
// new fails with errWouldWait instead.
func (n *Node) queue(ctx context.Context, peer krcore.Principal, wait bool) (*sharedQueue, error) {
	n.mu.Lock()
	if n.queues == nil {
		n.mu.Unlock()
		return nil, fmt.Errorf("smc: node closed: %w", krcore.ErrClosed)
	}
	var best *sharedQueue
	qs := n.queues[peer]
	for _, s := range qs {
		if best == nil || s.users < best.users {
			best = s
		}
	}
	if best != nil && (best.users == 0 || len(qs) >= queuesPerPeer) {
		best.users++
		n.mu.Unlock()
		return best, nil
	}
	n.mu.Unlock()
	if !wait {
		return nil, errWouldWait
	}
	q, err := n.api.Queue()
	if err != nil {
		return nil, err
	}
	if err := q.Connect(ctx, peer.Node, &krcore.ConnectOptions{Port: peer.Port}); err != nil {
		q.Close()
		return nil, err
	}
	s := &sharedQueue{q: q, users: 1}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.queues == nil {
		q.Close()
		return nil, fmt.Errorf("smc: node closed: %w", krcore.ErrClosed)
	}
	n.queues[peer] = append(n.queues[peer], s)
	return s, nil
}

// putQueue is a connection's end of using s: a queue on which a request
// failed (it may be in error) is no longer handed out, and closes once
// its last user is gone; a healthy one stays for later connections.
func (n *Node) putQueue(peer krcore.Principal, s *sharedQueue, healthy bool) {
	n.mu.Lock()
	s.users--
	if !healthy && !s.broken {
		s.broken = true
		if n.queues != nil {
			n.queues[peer] = slices.DeleteFunc(n.queues[peer], func(x *sharedQueue) bool { return x == s })
		}
	}
	shut := s.broken && s.users == 0
	n.mu.Unlock()
	if shut {
		s.q.Close()
	}
}

// rmbPool is the pool of receive buffers of size bytes for connections
// with peer, those this Node dialled apart from those it accepted: its
// slabs are exported to that endpoint alone, as SMC-R keeps an RMB per
// link group, so that no other process can find them, let alone write.
// Dialled connections' slabs are apart because an accept names its slab
// to whoever proposed, which may be a process claiming to be peer: it
// learns the name of a slab of accepted connections only, never one that
// the Node's connections dialled to peer use ("rmc" in the name, "rmb"
// for accepted ones; the name stays within a CLC message's 64 bytes).
func (n *Node) rmbPool(peer krcore.Principal, size int, dialled bool) *bufPool {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := rmbKey{peer, size, dialled}
	p := n.rmbs[k]
	if p == nil {
		role := "rmb"
		if dialled {
			role = "rmc"
		}
		p = &bufPool{api: n.api, size: size, access: verbs.AccessLocalWrite | verbs.AccessRemoteWrite, mem: n.mem,
			grown:  size > n.startSize,
			export: fmt.Sprintf("smc/%x/%s/%x-%x/%x", n.id, role, peer.Node, peer.Port, size), to: []krcore.Principal{peer}}
		n.rmbs[k] = p
	}
	return p
}

// stagePool is the pool of staging buffers with rings of size bytes
// (and the CDC slots behind).
func (n *Node) stagePool(size int) *bufPool {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.stages[size]
	if p == nil {
		p = &bufPool{api: n.api, size: size + stageExtra, access: verbs.AccessLocalWrite, mem: n.mem, grown: size > n.startSize}
		n.stages[size] = p
	}
	return p
}

// pools lists the receive buffer pools.
func (n *Node) pools() []*bufPool {
	n.mu.Lock()
	defer n.mu.Unlock()
	ps := make([]*bufPool, 0, len(n.rmbs))
	for _, p := range n.rmbs {
		ps = append(ps, p)
	}
	return ps
}

// budget bounds the registered memory of a Node's pools.
type budget struct {
	used atomic.Int64
	max  int64
}

// errWouldWait: a step asked not to wait (Accept answering a proposal
// itself) needs to register, export or connect something first.
var errWouldWait = errors.New("smc: the step would wait")

// errNoMemory: a slab would pass the Node's memory bound.
var errNoMemory = errors.New("smc: the Node's buffer memory bound (NodeOptions.MaxMemory) is reached")

// take reserves n bytes, if the bound allows.
func (b *budget) take(n int) bool {
	if b.used.Add(int64(n)) > b.max {
		b.used.Add(-int64(n))
		return false
	}
	return true
}

// bufPool hands out fixed-size buffers carved from registered slabs
// (slabElems each), exported under export+slab number to the principals
// to when export is set. A pool of grown buffers (larger than a new
// connection's) has slabs of at most slabBytes, and releases one whose
// buffers all came back when it has another such, so that the memory of
// buffers grown for a burst goes back to the Node's bound; other pools
// keep their slabs, which their peers know, for later connections.
type bufPool struct {
	api    krcore.API
	size   int
	access verbs.Access
	export string
	to     []krcore.Principal
	mem    *budget
	grown  bool

	mu    sync.Mutex
	slabs []*slab
	free  []buffer
	next  int // the next slab's number: names are never reused
}

type slab struct {
	pool   *bufPool
	mr     krcore.MR
	name   string // export name, "" if not exported
	used   int    // buffers handed out, fenced ones too; under pool.mu
	fenced int    // buffers fenced (bufPool.fence); under pool.mu
}

// buffer is one element of a slab.
type buffer struct {
	s   *slab
	off int
}

func (b buffer) bytes(size int) []byte { return b.s.mr.Bytes()[b.off : b.off+size] }

// get takes a free buffer, registering a new slab when none is left.
func (p *bufPool) get() (buffer, error) { return p.take(true) }

// take is get, failing with errWouldWait instead of registering a slab
// unless grow.
func (p *bufPool) take(grow bool) (buffer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		if !grow {
			return buffer{}, errWouldWait
		}
		if err := p.grow(); err != nil {
			return buffer{}, err
		}
	}
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	b.s.used++
	return b, nil
}

// grow registers (and exports) one more slab, within the memory bound;
// p.mu held.
func (p *bufPool) grow() error {
	elems := slabElems
	if p.grown {
		elems = max(1, min(slabElems, slabBytes/p.size))
	}
	if !p.mem.take(p.size * elems) {
		return fmt.Errorf("a slab of %d buffers of %d bytes: %w", elems, p.size, errNoMemory)
	}
	mr, err := p.api.RegMR(p.size*elems, p.access)
	if err != nil {
		p.mem.used.Add(-int64(p.size * elems))
		return fmt.Errorf("register a slab of %d buffers of %d bytes: %w", elems, p.size, err)
	}
	s := &slab{pool: p, mr: mr}
	if p.export != "" {
		s.name = fmt.Sprintf("%s/%d", p.export, p.next)
		if err := p.api.Export(s.name, mr, 0, mr.Len(), verbs.AccessRemoteWrite, p.to...); err != nil {
			p.api.Deregister(mr)
			p.mem.used.Add(-int64(mr.Len()))
			return fmt.Errorf("export slab %s: %w", s.name, err)
		}
	}
	p.next++
	p.slabs = append(p.slabs, s)
	for i := elems - 1; i >= 0; i-- {
		p.free = append(p.free, buffer{s: s, off: i * p.size})
	}
	return nil
}

// put gives b back for a later connection: its peer WRITEs into it no
// more.
func (p *bufPool) put(b buffer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b.s.fenced > 0 {
		b.s.used--
		p.dropFenced(b.s)
		return
	}
	p.free = append(p.free, b)
	if b.s.used--; b.s.used > 0 || !p.grown {
		return
	}
	for _, s := range p.slabs {
		if s != b.s && s.used == 0 {
			p.drop(b.s)
			return
		}
	}
}

// fence retires b, a receive buffer whose peer may still WRITE into it
// (it never said it writes no more): neither b nor any other buffer of
// its slab is handed out again, and the slab is withdrawn and
// deregistered once its other buffers come back, so that a late WRITE
// fails at the peer instead of landing in a later connection's ring.
// Only abnormal ends fence: a peer's close flag follows its last WRITE
// on the same queue.
func (p *bufPool) fence(b buffer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := b.s
	s.fenced++
	p.free = slices.DeleteFunc(p.free, func(x buffer) bool { return x.s == s })
	p.dropFenced(s)
}

// dropFenced releases slab s, which has fenced buffers, once no other
// buffer of it is handed out; p.mu held.
func (p *bufPool) dropFenced(s *slab) {
	if s.used == s.fenced && slices.Contains(p.slabs, s) {
		p.drop(s)
	}
}

// drop releases slab s, none of whose buffers is handed out; p.mu held.
func (p *bufPool) drop(s *slab) {
	p.free = slices.DeleteFunc(p.free, func(b buffer) bool { return b.s == s })
	p.slabs = slices.DeleteFunc(p.slabs, func(x *slab) bool { return x == s })
	p.release(s)
}

// release withdraws and deregisters s; p.mu held.
func (p *bufPool) release(s *slab) {
	if s.name != "" {
		p.api.Unexport(s.name)
	}
	p.mem.used.Add(-int64(s.mr.Len()))
	p.api.Deregister(s.mr)
}

// close withdraws and releases every slab.
func (p *bufPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.slabs {
		p.release(s)
	}
	p.slabs, p.free = nil, nil
}
