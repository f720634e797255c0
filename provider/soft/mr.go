package soft

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// pd is a protection domain.
type pd struct {
	node   *Node
	id     uint64       // names it in the node's export table (shmplace.go)
	refs   atomic.Int32 // MRs, QPs, SRQs and AHs made from it
	closed atomic.Bool
}

// AllocPD allocates a protection domain.
func (n *Node) AllocPD() (verbs.PD, error) {
	if err := n.reserve(&n.counts.pd, n.attr.MaxPD, "PD"); err != nil {
		return nil, err
	}
	p := &pd{node: n, id: pdSeq.Add(1)}
	if err := track(n, n.pds, p); err != nil {
		n.release(&n.counts.pd)
		return nil, err
	}
	return p, nil
}

func (p *pd) Close() error {
	if r := p.refs.Load(); r > 0 {
		return fmt.Errorf("soft: dealloc PD with %d objects: %w", r, verbs.ErrBusy)
	}
	if p.closed.Swap(true) {
		return fmt.Errorf("soft: PD: %w", verbs.ErrClosed)
	}
	p.node.release(&p.node.counts.pd)
	untrack(p.node, p.node.pds, p)
	return nil
}

func (p *pd) use() error {
	if p.closed.Load() {
		return fmt.Errorf("soft: PD: %w", verbs.ErrClosed)
	}
	if err := p.node.checkOpen(); err != nil {
		return err
	}
	p.refs.Add(1)
	return nil
}

// mr is a registered memory region. users counts operations copying into
// or out of it, so Close can wait for them before the memory is unpinned.
type mr struct {
	pd     *pd
	buf    []byte
	base   uint64
	key    uint32
	access verbs.Access
	unpin  func()
	users  atomic.Int32
	dead   atomic.Bool
	// exported: listed in the node's export table (shmplace.go); set by
	// RegMR, cleared by Close.
	exported bool
}

// RegMR registers off-heap memory.
func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	n := p.node
	if len(buf) == 0 || uint64(len(buf)) > n.attr.MaxMRSize {
		return nil, fmt.Errorf("soft: register %d bytes (max %d): %w", len(buf), n.attr.MaxMRSize, verbs.ErrInvalid)
	}
	if access&^verbs.AccessAll != 0 {
		return nil, fmt.Errorf("soft: register with access %s: %w", access, verbs.ErrInvalid)
	}
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("soft: register with %s needs LOCAL_WRITE: %w", access, verbs.ErrInvalid)
	}
	unpin, err := offheap.Pin(buf)
	if err != nil {
		return nil, fmt.Errorf("soft: register: %w: %w", verbs.ErrInvalid, err)
	}
	if err := n.reserve(&n.counts.mr, n.attr.MaxMR, "MR"); err != nil {
		unpin()
		return nil, err
	}
	if err := p.use(); err != nil {
		unpin()
		n.release(&n.counts.mr)
		return nil, err
	}
	m := &mr{pd: p, buf: buf, base: offheap.Addr(buf), access: access, unpin: unpin}
	n.mrMu.Lock()
	for {
		k := uint32(n.keys.next())
		if _, taken := n.mrs[k]; !taken && k != 0 {
			m.key = k
			break
		}
	}
	n.mrs[m.key] = m
	n.mrMu.Unlock()
	n.exportMR(m)
	if n.closed.Load() { // the node closed meanwhile: destroyAll may have missed m
		m.Close()
		return nil, errNodeClosed
	}
	return m, nil
}

func (m *mr) LKey() uint32         { return m.key }
func (m *mr) RKey() uint32         { return m.key }
func (m *mr) Addr() uint64         { return m.base }
func (m *mr) Len() int             { return len(m.buf) }
func (m *mr) Bytes() []byte        { return m.buf }
func (m *mr) Access() verbs.Access { return m.access }

// Close deregisters the region once no operation is copying through it.
func (m *mr) Close() error {
	if m.dead.Swap(true) {
		return fmt.Errorf("soft: deregister MR %#x: %w", m.key, verbs.ErrClosed)
	}
	n := m.pd.node
	n.unexportMR(m)
	n.mrMu.Lock()
	delete(n.mrs, m.key)
	n.mrMu.Unlock()
	awaitDone(func() bool { return m.users.Load() == 0 }, nil)
	m.unpin()
	m.pd.refs.Add(-1)
	n.release(&n.counts.mr)
	return nil
}

// acquire finds the MR named by key in pd and holds it for a copy of
// [addr, addr+length) needing access. It returns the bytes or why not.
func (n *Node) acquire(key uint32, p *pd, addr uint64, length uint64, need verbs.Access) (*mr, []byte, bool) {
	n.mrMu.RLock()
	m := n.mrs[key]
	n.mrMu.RUnlock()
	if m == nil || m.pd != p || m.access&need != need {
		return nil, nil, false
	}
	if addr < m.base || addr-m.base > uint64(len(m.buf)) || length > uint64(len(m.buf))-(addr-m.base) {
		return nil, nil, false
	}
	m.users.Add(1)
	if m.dead.Load() {
		m.users.Add(-1)
		return nil, nil, false
	}
	off := addr - m.base
	return m, m.buf[off : off+length : off+length], true
}

func (m *mr) done() { m.users.Add(-1) }

// hold takes m again for a copy after a done, unless it was deregistered
// since; it is held on return either way (undone by done), and its
// Deregister waits for it.
func (m *mr) hold() bool {
	m.users.Add(1)
	return !m.dead.Load()
}

// ah is an address handle.
type ah struct {
	pd   *pd
	dest verbs.Endpoint
	dead atomic.Bool
}

// CreateAH makes an address handle for a remote port named by Dest.Addr.
func (p *pd) CreateAH(attr verbs.AHAttr) (verbs.AH, error) {
	if attr.Dest.Addr == "" {
		return nil, fmt.Errorf("soft: address handle needs Dest.Addr: %w", verbs.ErrInvalid)
	}
	if err := p.use(); err != nil {
		return nil, err
	}
	a := &ah{pd: p, dest: attr.Dest}
	if err := track(p.node, p.node.ahs, a); err != nil {
		p.refs.Add(-1)
		return nil, err
	}
	return a, nil
}

func (a *ah) Dest() verbs.Endpoint { return a.dest }

func (a *ah) Close() error {
	if a.dead.Swap(true) {
		return fmt.Errorf("soft: address handle: %w", verbs.ErrClosed)
	}
	a.pd.refs.Add(-1)
	untrack(a.pd.node, a.pd.node.ahs, a)
	return nil
}

// awaitDone waits until done reports true, for copies that other
// goroutines (or, in place, the peer process) are finishing: it yields
// to the scheduler at first, a copy ending within microseconds, then
// sleeps in short steps. It gives up once abandon (if not nil) reports
// true: whoever was copying is gone.
func awaitDone(done, abandon func() bool) {
	for i := 0; !done(); i++ {
		if i < 64 {
			runtime.Gosched()
			continue
		}
		if abandon != nil && abandon() {
			return
		}
		time.Sleep(20 * time.Microsecond)
	}
}
