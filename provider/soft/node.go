package soft

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/krcore/krcore/verbs"
)

// Node is one software RNIC: a verbs.Device on one fabric address.
type Node struct {
	fab   *Fabric
	cfg   Config
	addr  string
	attr  verbs.DeviceAttr
	mtu   int
	keys  *keySource
	start time.Time

	closed atomic.Bool
	stop   chan struct{}
	lent   atomic.Int32   // TCP links whose read role is lent (read.go)
	wg     sync.WaitGroup // goroutines the node owns: listener, links, sweeper

	mu     sync.Mutex // guards the counts and the live objects below
	counts struct{ pd, cq, mr, qp, srq int }
	cqs    map[*cq]struct{}
	pds    map[*pd]struct{}
	srqs   map[*srq]struct{}
	ahs    map[*ah]struct{}

	mrMu sync.RWMutex
	mrs  map[uint32]*mr // by key (lkey == rkey)

	qpMu    sync.RWMutex
	qps     map[uint32]*qp
	nextQPN uint32

	holding atomic.Bool // HoldResponses is in force
	holdMu  sync.Mutex  // guards held, and holding's changes
	held    []heldResponse

	mem     memLinks
	ln      net.Listener
	linkMu  sync.Mutex
	tcp     map[string]*tcpLink // by peer address
	accepts map[net.Conn]struct{}
	shm     map[string]*shmLink // by peer address, guarded by linkMu (shm.go)
	// placing holds the shm links whose segment is mapped, dying ones
	// too: fencePlace fences each until its own finish has (shmplace.go);
	// guarded by linkMu.
	placing map[*shmLink]struct{}
	shmLn   *net.UnixListener
	shmWhy  error         // why the node has no shared-memory listener
	exports *exports      // what peers may access in place (shmplace.go); nil if none
	placed  atomic.Uint64 // requests carried out in place
}

func newNode(fab *Fabric, cfg Config) (*Node, error) {
	if cfg.RetryTimeout <= 0 {
		cfg.RetryTimeout = DefaultRetryTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = cfg.RetryTimeout
	}
	if cfg.MTU <= 0 {
		cfg.MTU = DefaultMTU
	}
	n := &Node{
		fab: fab, cfg: cfg, attr: mergeAttr(cfg.Attr, cfg.NoDC), mtu: cfg.MTU, keys: newKeySource(),
		start: time.Now(), stop: make(chan struct{}),
		cqs: make(map[*cq]struct{}), pds: make(map[*pd]struct{}), srqs: make(map[*srq]struct{}), ahs: make(map[*ah]struct{}), mrs: make(map[uint32]*mr), qps: make(map[uint32]*qp), mem: memLinks{m: make(map[string]*memLink)},
		tcp: make(map[string]*tcpLink), accepts: make(map[net.Conn]struct{}), shm: make(map[string]*shmLink), placing: make(map[*shmLink]struct{}),
	}
	// QPNs are 24 bits; start somewhere random so numbers from a restarted
	// node do not alias the old one's.
	n.nextQPN = uint32(n.keys.next()%(1<<23)) + 0x100
	switch {
	case cfg.Listen != "":
		ln, err := net.Listen("tcp", cfg.Listen)
		if errors.Is(err, syscall.EADDRINUSE) { // another node or process has it
			return nil, fmt.Errorf("soft: listen %s: %w: %w", cfg.Listen, ErrAddrInUse, err)
		}
		if err != nil {
			return nil, fmt.Errorf("soft: listen %s: %w", cfg.Listen, err)
		}
		n.ln, n.addr = ln, ln.Addr().String()
		n.wg.Add(1)
		go n.acceptEach(ln, n.serveConn)
		n.listenShm()
	case cfg.Name != "":
		n.addr = "mem:" + cfg.Name
	default:
		n.addr = fmt.Sprintf("mem:node%d", nodeSeq.Add(1))
	}
	n.wg.Add(1)
	go n.sweepLoop()
	return n, nil
}

func mergeAttr(o verbs.DeviceAttr, noDC bool) verbs.DeviceAttr {
	a := defaultAttr
	a.DCSupported = !noDC
	pick := func(dst *int, v int) {
		if v > 0 {
			*dst = v
		}
	}
	pick(&a.MaxQP, o.MaxQP)
	pick(&a.MaxQPWR, o.MaxQPWR)
	pick(&a.MaxSGE, o.MaxSGE)
	pick(&a.MaxCQ, o.MaxCQ)
	pick(&a.MaxCQE, o.MaxCQE)
	pick(&a.MaxMR, o.MaxMR)
	pick(&a.MaxPD, o.MaxPD)
	pick(&a.MaxSRQ, o.MaxSRQ)
	pick(&a.MaxSRQWR, o.MaxSRQWR)
	pick(&a.MaxInline, o.MaxInline)
	if o.MaxMRSize > 0 {
		a.MaxMRSize = o.MaxMRSize
	}
	if o.MaxMsgSize > 0 && o.MaxMsgSize < a.MaxMsgSize {
		a.MaxMsgSize = o.MaxMsgSize
	}
	return a
}

// Addr is the node's fabric address ("mem:NAME" or "HOST:PORT").
func (n *Node) Addr() string { return n.addr }

// Name is the node's fabric address.
func (n *Node) Name() string { return n.addr }

// Attr reports the device limits.
func (n *Node) Attr() verbs.DeviceAttr { return n.attr }

// Port reports the node's single port.
func (n *Node) Port() verbs.PortAttr {
	return verbs.PortAttr{Num: 1, Active: !n.closed.Load(), MTU: n.mtu, Addr: n.addr}
}

// Close stops the node: its listener and links close, every QP moves to
// ERR (flushing its work), waiters on its CQs are woken with ErrClosed,
// everything made from it (QPs, AHs, SRQs, MRs, CQs, PDs) is destroyed and
// its memory unpinned, and every later call fails with ErrClosed (a later
// Close of one of those objects too).
func (n *Node) Close() error {
	if n.closed.Swap(true) {
		return errNodeClosed
	}
	n.fab.remove(n)
	close(n.stop)
	// The shared-memory name before the TCP port: the next node to listen
	// on the port (in any process) must find the name free, or it is
	// reached over TCP for its life.
	if n.shmLn != nil {
		n.shmLn.Close()
	}
	if n.ln != nil {
		n.ln.Close()
	}
	n.closeLinks()
	n.closeShm()
	n.qpMu.RLock()
	qps := make([]*qp, 0, len(n.qps))
	for _, q := range n.qps {
		qps = append(qps, q)
	}
	n.qpMu.RUnlock()
	for _, q := range qps {
		q.fail(verbs.WRFlushErr)
	}
	n.mu.Lock()
	cqs := make([]*cq, 0, len(n.cqs))
	for c := range n.cqs {
		cqs = append(cqs, c)
	}
	n.mu.Unlock()
	for _, c := range cqs {
		c.wakeAll()
	}
	n.wg.Wait()
	n.destroyAll()
	if e := n.exports; e != nil {
		e.mu.Lock() // an export racing Close finds it closed, not unmapped
		e.closed = true
		e.blk.Close()
		e.mu.Unlock()
	}
	return nil
}

// destroyAll destroys every object made from the closed node, users
// before what they use. An object its owner destroys meanwhile reports
// ErrClosed to one of the two, which is all either needs.
func (n *Node) destroyAll() {
	n.qpMu.RLock()
	objs := appendValues(nil, n.qps)
	n.qpMu.RUnlock()
	n.mrMu.RLock()
	objs = appendValues(objs, n.mrs)
	n.mrMu.RUnlock()
	n.mu.Lock()
	objs = appendKeys(objs, n.ahs)
	objs = appendKeys(objs, n.srqs)
	objs = appendKeys(objs, n.cqs)
	objs = appendKeys(objs, n.pds)
	n.mu.Unlock()
	for _, o := range objs {
		o.Close()
	}
}

func appendValues[K comparable, V io.Closer](dst []io.Closer, m map[K]V) []io.Closer {
	for _, v := range m {
		dst = append(dst, v)
	}
	return dst
}

func appendKeys[K interface {
	comparable
	io.Closer
}](dst []io.Closer, set map[K]struct{}) []io.Closer {
	for k := range set {
		dst = append(dst, k)
	}
	return dst
}

// track adds a new object to its node's set of live ones, unless the node
// is closed (then the caller destroys the object and fails): with the
// check under n.mu, an object is either in the set destroyAll empties or
// sees the node closed.
func track[K comparable](n *Node, set map[K]struct{}, k K) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed.Load() {
		return errNodeClosed
	}
	set[k] = struct{}{}
	return nil
}

// untrack removes a destroyed object from its node's set.
func untrack[K comparable](n *Node, set map[K]struct{}, k K) {
	n.mu.Lock()
	delete(set, k)
	n.mu.Unlock()
}

// Stats counts a node's live objects, for leak checks.
type Stats struct {
	PDs, CQs, MRs, QPs, SRQs, Links int
	// InPlace counts the node's requests carried out in place over
	// shared-memory links (shmplace.go), since it started.
	InPlace uint64
}

// Stats reports the node's live objects.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	s := Stats{PDs: n.counts.pd, CQs: n.counts.cq, MRs: n.counts.mr, QPs: n.counts.qp, SRQs: n.counts.srq, InPlace: n.placed.Load()}
	n.mu.Unlock()
	n.linkMu.Lock()
	s.Links = len(n.tcp)
	for _, l := range n.shm {
		if l.up {
			s.Links++
		}
	}
	n.linkMu.Unlock()
	return s
}

// reserve counts one more object of a kind against its limit.
func (n *Node) reserve(count *int, limit int, what string) error {
	if err := n.checkOpen(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if *count >= limit {
		return fmt.Errorf("soft: %d %ss already: %w", *count, what, verbs.ErrLimit)
	}
	*count++
	return nil
}

func (n *Node) release(count *int) {
	n.mu.Lock()
	*count--
	n.mu.Unlock()
}

// sweepLoop fails requests whose response is overdue: the hardware retry
// timer, which is what turns a dead link or a missing peer QP into
// RETRY_EXC_ERR instead of a hang.
//
// An RNIC's timer and its receive path run on the card, so a host that
// stalls stalls neither. Here both run in this process: a sweep that
// comes late (the process went without a CPU) may find responses that
// arrived during the stall still unread in the link, their reader stalled
// with it. Such a sweep expires nothing and leaves the next, one period
// later, to judge; only one sweep in a row is skipped, so a process
// stalling at every tick still fails what is overdue.
func (n *Node) sweepLoop() {
	defer n.wg.Done()
	period := n.cfg.RetryTimeout / 8
	period = min(max(period, time.Millisecond), 100*time.Millisecond)
	t := time.NewTicker(period)
	defer t.Stop()
	var qps []*qp
	last, skipped := n.now(), false
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		now := n.now()
		var due bool
		due, skipped = sweepDue(time.Duration(now-last), period, skipped)
		last = now
		if !due {
			continue
		}
		qps = qps[:0]
		n.qpMu.RLock()
		for _, q := range n.qps {
			if d := q.deadline.Load(); d != 0 && d < now {
				qps = append(qps, q)
			}
		}
		n.qpMu.RUnlock()
		for _, q := range qps {
			q.expire(now)
		}
	}
}

// sweepDue decides whether a sweep that comes since after the previous
// one (due every period) expires requests: not if it comes more than
// two periods after it, unless the previous sweep was skipped for the same
// reason. skip reports whether this one is skipped.
func sweepDue(since, period time.Duration, skippedLast bool) (due, skip bool) {
	if since > 2*period && !skippedLast {
		return false, true
	}
	return true, false
}

// now is monotonic nanoseconds since the node started.
func (n *Node) now() int64 { return int64(time.Since(n.start)) + 1 }
