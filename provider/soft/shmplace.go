//go:build linux

package soft

import (
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// RDMA READ and WRITE in place over a shared-memory link.
//
// Where the responder's MR lies in a memfd (offheap.AllocShared memory),
// an RC requester on a shared-memory link copies between its own SGEs and
// the responder's memory itself, once, as an RNIC's DMA does, instead of
// sending the request through the ring and waiting for the responder's
// reader to copy it into (or out of) the ring. What the responder's RNIC
// checks still decides, and only the responder writes it:
//
//   - Each node that listens for shared-memory links keeps an export
//     table, a memfd it alone writes; peers map it read-only (by
//     /proc/PID/fd of the peer that SO_PEERCRED names, the inode checked
//     against the one the peer published in the link's control page).
//     It lists the node's RC QPs that can answer (RTR or RTS, with their
//     connected peer, access flags and PD) and its MRs with remote access
//     in sealed memfds (key, PD, access, bounds, and where in which memfd
//     the bytes lie). A requester goes in place only when both entries say
//     the ring path would succeed: its QP is the one the responder QP is
//     connected to, the QP and the MR grant the access, the PDs match and
//     the range is inside the MR. Anything else (a missing or colliding
//     entry, a violation, a deregistered key, a QP in ERR or destroyed)
//     goes through the ring, whose responder produces the error an RNIC
//     would: REM_ACCESS_ERR, RETRY_EXC_ERR for a QP that is gone, and so
//     on. Atomics, SENDs and WRITE_WITH_IMM always take the ring.
//   - Invalidation fences in-place access. A requester counts itself in
//     the link's in-place word for its side (shmSeg.copying) before it
//     reads the entries, and out after its copy. A responder that
//     deregisters an MR, or whose QP leaves RTR/RTS or is destroyed,
//     clears the entry first and then waits until every link's peer
//     count has been seen at zero (or the peer process has exited): a
//     copy that saw the entry valid had counted itself in before the
//     clear, so once Deregister (or Modify, or Close) returns no copy
//     that saw the old entry is still running, and none starts.
//   - Order on a QP is kept: a request goes in place only when every
//     earlier one on its QP has completed (nothing of it is left in the
//     ring or in flight); otherwise it follows them through the ring. A
//     request carried out in place takes no PSN.
//   - The link's end fences it too: the side that finishes a link marks
//     it closed in the segment (no copy starts after) and waits for the
//     peer's count before it unmaps.
//
// Trust model: both processes run as the same user in the same user
// namespace (checked when the link is made), who could read and write
// each other's memory anyway (ptrace, /proc/PID/mem). In-place access maps
// the whole memfd behind an exported MR into the peer, writable: the
// checks above keep a correct peer inside the MRs and rights the responder
// granted, but they protect against mistakes, not against a hostile peer
// of the same user. A peer killed in the middle of a copy has written at
// most part of the range the rkey granted to its in-flight WRITE, which
// is what an RNIC whose link dies mid-WRITE leaves (its bytes are
// undefined, the request never completed); a READ cut short writes
// nothing of the survivor's. A peer stopped (SIGSTOP) in the middle of a
// copy holds the responder's Deregister, QP teardown and link close until
// it runs or exits. A requester keeps a mapping of each responder memfd
// it used until the link ends or it has mapped placeMaxMaps of them (then
// it drops them all), so memory the responder frees stays allocated that
// long.

// Export table geometry: placeQPSlots entries for QPs, then placeMRSlots
// for MRs, each one line of placeWords words. An object goes in the slot
// its number names; one that finds it taken is not exported (its
// requests take the ring).
const (
	placeQPSlots = 4096
	placeMRSlots = 8192
	placeWords   = 8
	placeSize    = (placeQPSlots + placeMRSlots) * placeWords * 8
)

// placeMaxMaps bounds the responder memfds a link's requester keeps mapped.
const placeMaxMaps = 64

// Words of a QP entry: tag (qpn<<1|1 while valid), the connected peer's
// QPN and the QP's access flags, a hash of the connected peer's address,
// the PD's id. Words of an MR entry: tag (key<<1|1), base address, length,
// access and PD id, then its memfd's descriptor number in the responder,
// the MR's offset in it, its inode and its size.
const (
	qpTag, qpDest, qpAddr, qpPD                                      = 0, 1, 2, 3
	mrTag, mrBase, mrLen, mrAccess, mrFD, mrOff, mrInode, mrFileSize = 0, 1, 2, 3, 4, 5, 6, 7
)

// exports is a node's export table.
type exports struct {
	blk   *offheap.Block
	inode uint64
	mu    sync.Mutex // serializes writers of slots
	// closed: the node closed and unmapped the table; guarded by mu.
	closed bool
}

// newExports makes a node's export table; nil if it cannot (the node then
// serves everything through the ring).
func newExports() *exports {
	blk, err := offheap.AllocShared("krcore-soft-exports", placeSize)
	if err != nil {
		return nil
	}
	var st unix.Stat_t
	if unix.Fstat(blk.FD(), &st) != nil {
		blk.Close()
		return nil
	}
	return &exports{blk: blk, inode: st.Ino}
}

// tableEntry is entry i (QP slots first, then MR slots) of a mapped table.
func tableEntry(mem []byte, i int) *[placeWords]atomic.Uint64 {
	return (*[placeWords]atomic.Uint64)(unsafe.Pointer(&mem[i*placeWords*8]))
}

func qpSlot(qpn uint32) int { return int(qpn % placeQPSlots) }
func mrSlot(key uint32) int { return placeQPSlots + int(key%placeMRSlots) }

// addrHash names a fabric address in a QP entry.
func addrHash(addr string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(addr))
	return h.Sum64() | 1
}

// pdSeq numbers protection domains, for export entries.
var pdSeq atomic.Uint64

// exportMR lists m in the node's export table if its memory is a sealed
// memfd and it grants remote READ or WRITE.
func (n *Node) exportMR(m *mr) {
	e := n.exports
	if e == nil || m.access&(verbs.AccessRemoteRead|verbs.AccessRemoteWrite) == 0 {
		return
	}
	blk, off, err := offheap.Find(m.buf)
	if err != nil || blk.FD() < 0 {
		return
	}
	fd := blk.FD()
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return // a peer's mapping of a file that can shrink could fault
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed { // RegMR racing the node's Close
		return
	}
	w := tableEntry(e.blk.Bytes(), mrSlot(m.key))
	if w[mrTag].Load() != 0 {
		return
	}
	w[mrBase].Store(m.base)
	w[mrLen].Store(uint64(len(m.buf)))
	w[mrAccess].Store(uint64(m.access) | m.pd.id<<32)
	w[mrFD].Store(uint64(fd))
	w[mrOff].Store(uint64(off))
	w[mrInode].Store(st.Ino)
	w[mrFileSize].Store(uint64(blk.Len()))
	w[mrTag].Swap(uint64(m.key)<<1 | 1)
	m.exported = true
}

// unexportMR takes m out of the export table and waits until no peer
// copies through it.
func (n *Node) unexportMR(m *mr) {
	e := n.exports
	if e == nil {
		return
	}
	e.mu.Lock() // m.exported is written under it (exportMR)
	was := m.exported
	if was && !e.closed {
		tableEntry(e.blk.Bytes(), mrSlot(m.key))[mrTag].Swap(0)
	}
	m.exported = false
	e.mu.Unlock()
	if was {
		n.fencePlace()
	}
}

// syncExport brings q's export entry in line with whether and how it may
// answer in-place requests now; q.mu is held. Taking an entry out waits
// for in-place copies that may have seen it.
func (q *qp) syncExport() {
	e := q.node.exports
	if e == nil || q.typ != verbs.RC {
		return
	}
	var want [placeWords]uint64
	if !q.destroyed && (q.state == verbs.StateRTR || q.state == verbs.StateRTS) {
		want[qpTag] = uint64(q.num)<<1 | 1
		want[qpDest] = uint64(q.dest.QPN) | uint64(q.access)<<32
		want[qpAddr] = addrHash(q.dest.Addr)
		want[qpPD] = q.pd.id
	}
	if want == q.exported {
		return
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	w := tableEntry(e.blk.Bytes(), qpSlot(q.num))
	if q.exported[qpTag] != 0 {
		w[qpTag].Swap(0)
		q.exported = [placeWords]uint64{}
		e.mu.Unlock()
		q.node.fencePlace()
		e.mu.Lock()
	}
	if want[qpTag] != 0 && !e.closed && w[qpTag].Load() == 0 {
		for i := qpDest; i < placeWords; i++ {
			w[i].Store(want[i])
		}
		w[qpTag].Swap(want[qpTag])
		q.exported = want
	}
	e.mu.Unlock()
}

// fencePlace waits until no peer's in-place copy that may have seen an
// entry before it was cleared is still running.
func (n *Node) fencePlace() {
	// Not only the links up: one killed but not yet finished (closePlace)
	// may still have a peer copying.
	n.linkMu.Lock()
	links := make([]*shmLink, 0, len(n.placing))
	for l := range n.placing {
		links = append(links, l)
	}
	n.linkMu.Unlock()
	for _, l := range links {
		l.fencePeer()
	}
}

// fencePeer waits until the peer's in-place count on l has been seen at
// zero, or the peer process has exited, or l is gone (its finish fenced
// it already).
func (l *shmLink) fencePeer() {
	l.segMu.RLock()
	defer l.segMu.RUnlock()
	if l.segGone {
		return
	}
	c := l.seg.copying(1 - l.side)
	awaitDone(func() bool { return c.Load() == 0 }, l.peerExited)
}

// peerExited reports whether the peer process is known to have exited.
func (l *shmLink) peerExited() bool {
	if l.pidfd < 0 {
		return l.pid > 0 && unix.Kill(l.pid, 0) == unix.ESRCH
	}
	fds := []unix.PollFd{{Fd: int32(l.pidfd), Events: unix.POLLIN}}
	k, err := unix.Poll(fds, 0)
	return err == nil && k > 0
}

// placer is a requester's view of the peer's export table and memory.
// An in-place request reads view and last without a lock; mu guards
// mapping (once per table or memfd), and unmapAll clears both with no
// copy running.
type placer struct {
	view atomic.Pointer[placeView] // set once the table is mapped
	last atomic.Pointer[placeMap]  // the memfd mapped last

	mu     sync.Mutex
	table  []byte            // the peer's export table, mapped read-only
	broken bool              // the table cannot be mapped: never in place
	maps   map[uint64][]byte // the peer's memfds by inode, mapped
	evict  atomic.Bool       // maps is full: drop them all when no copy runs
}

// placeView is the peer's mapped export table and this node's address as
// the peer's QP entries name it (addrHash).
type placeView struct {
	table []byte
	self  uint64
}

// placeMap is one mapped memfd of the peer's, by inode.
type placeMap struct {
	ino uint64
	mem []byte
}

// copying is side s's count of in-place copies it is making in the other
// side's memory (control page line 13+s); closedLine marks a link one side
// is finishing (line 15); exportLine is side s's export table, as its
// descriptor number+1, inode and size (line 11+s).
func (s *shmSeg) copying(side int) *atomic.Int64 {
	return (*atomic.Int64)(unsafe.Pointer(s.line(13 + side)))
}
func (s *shmSeg) closing() *atomic.Uint64 { return s.line(15) }
func (s *shmSeg) exportLine(side int) *[3]atomic.Uint64 {
	return (*[3]atomic.Uint64)(unsafe.Pointer(s.line(11 + side)))
}

// publishExports tells the peer where this node's export table is.
func (l *shmLink) publishExports() {
	e := l.node.exports
	if e == nil {
		return
	}
	w := l.seg.exportLine(l.side)
	w[1].Store(e.inode)
	w[2].Store(placeSize)
	w[0].Swap(uint64(e.blk.FD()) + 1)
}

// openPeer maps the peer's file at descriptor fd, checking that it is the
// one with inode ino, size bytes, shared (writable unless ro).
func (l *shmLink) openPeer(fd, ino, size uint64, ro bool) ([]byte, error) {
	flags, prot := unix.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	if ro {
		flags, prot = unix.O_RDONLY, unix.PROT_READ
	}
	f, err := unix.Open(fmt.Sprintf("/proc/%d/fd/%d", l.pid, fd), flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(f)
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil {
		return nil, err
	}
	if st.Ino != ino || uint64(st.Size) < size || size == 0 || size > 1<<46 {
		return nil, fmt.Errorf("soft: peer descriptor %d is not the file it published", fd)
	}
	return unix.Mmap(f, 0, int(size), prot, unix.MAP_SHARED)
}

// peerTable returns the peer's export table, mapping it the first time;
// nil while the peer has not published it or if it cannot be mapped.
// l.segMu is read-held.
func (p *placer) peerTable(l *shmLink) *placeView {
	if v := p.view.Load(); v != nil {
		return v
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.table != nil || p.broken {
		return p.view.Load()
	}
	w := l.seg.exportLine(1 - l.side)
	fd := w[0].Load()
	if fd == 0 {
		return nil // not yet published
	}
	if w[2].Load() != placeSize || l.pid <= 0 {
		p.broken = true
		return nil
	}
	t, err := l.openPeer(fd-1, w[1].Load(), placeSize, true)
	if err != nil {
		p.broken = true
		return nil
	}
	p.table = t
	v := &placeView{table: t, self: addrHash(l.node.addr)}
	p.view.Store(v)
	return v
}

// mapping returns the peer's memfd with inode ino, mapping it if needed;
// nil if it cannot. l.segMu is read-held.
func (p *placer) mapping(l *shmLink, fd, ino, size uint64) []byte {
	if m := p.last.Load(); m != nil && m.ino == ino {
		return fit(m.mem, size)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if m, ok := p.maps[ino]; ok {
		p.last.Store(&placeMap{ino: ino, mem: m})
		return fit(m, size)
	}
	if len(p.maps) >= placeMaxMaps {
		p.evict.Store(true)
		return nil
	}
	m, err := l.openPeer(fd, ino, size, false)
	if err != nil {
		return nil
	}
	if p.maps == nil {
		p.maps = make(map[uint64][]byte)
	}
	p.maps[ino] = m
	p.last.Store(&placeMap{ino: ino, mem: m})
	return m
}

// fit returns m if it holds size bytes, else nil.
func fit(m []byte, size uint64) []byte {
	if uint64(len(m)) < size {
		return nil
	}
	return m
}

// unmapAll drops every mapping of the peer's memory; no copy runs (l.segMu
// is held for writing).
func (p *placer) unmapAll(table bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last.Store(nil)
	for ino, m := range p.maps {
		unix.Munmap(m)
		delete(p.maps, ino)
	}
	p.evict.Store(false)
	if table && p.table != nil {
		p.view.Store(nil)
		unix.Munmap(p.table)
		p.table = nil
		p.broken = true
	}
}

// inPlace carries out w, an RC READ or WRITE of q, in place if the peer's
// export table says the ring path would succeed; it reports the bytes
// moved and whether it did. q.mu is held and nothing earlier on q is
// outstanding.
func (l *shmLink) inPlace(q *qp, w *wqe) (uint32, bool) {
	op := w.wr.Op
	total := w.wr.Len()
	if op != verbs.OpRead && op != verbs.OpWrite || total == 0 || uint32(total) > q.node.attr.MaxMsgSize || q.node.holding.Load() {
		return 0, false
	}
	if l.place.evict.Load() {
		l.segMu.Lock()
		if !l.segGone {
			l.place.unmapAll(false)
		}
		l.segMu.Unlock()
	}
	l.segMu.RLock()
	defer l.segMu.RUnlock()
	if l.segGone {
		return 0, false
	}
	view := l.place.peerTable(l)
	if view == nil {
		return 0, false
	}
	c := l.seg.copying(l.side)
	c.Add(1)
	defer c.Add(-1)
	if l.seg.closing().Load() != 0 || l.dead.Load() || !l.seg.peerAlive(1-l.side) {
		return 0, false
	}
	remote, ok := l.checkPlace(q, w, view)
	if !ok {
		return 0, false
	}
	if !q.copyPlace(w, remote) {
		return 0, false
	}
	l.node.placed.Add(1)
	return uint32(total), true
}

// checkPlace checks w against the peer's QP and MR entries, as the
// responder's execute and perform would, and returns the remote bytes.
// The caller counts itself in the link's in-place word.
func (l *shmLink) checkPlace(q *qp, w *wqe, view *placeView) ([]byte, bool) {
	table := view.table
	need := verbs.AccessRemoteRead
	if w.wr.Op == verbs.OpWrite {
		need = verbs.AccessRemoteWrite
	}
	qe := tableEntry(table, qpSlot(q.dest.QPN))
	if qe[qpTag].Load() != uint64(q.dest.QPN)<<1|1 {
		return nil, false
	}
	dest := qe[qpDest].Load()
	if uint32(dest) != q.num || verbs.Access(dest>>32)&need == 0 || qe[qpAddr].Load() != view.self {
		return nil, false
	}
	pdID := qe[qpPD].Load()
	me := tableEntry(table, mrSlot(w.wr.RKey))
	if me[mrTag].Load() != uint64(w.wr.RKey)<<1|1 {
		return nil, false
	}
	acc := me[mrAccess].Load()
	base, length := me[mrBase].Load(), me[mrLen].Load()
	addr, n := w.wr.RemoteAddr, uint64(w.wr.Len())
	if verbs.Access(uint32(acc))&need == 0 || acc>>32 != pdID || addr < base || addr-base > length || n > length-(addr-base) {
		return nil, false
	}
	off, size := me[mrOff].Load(), me[mrFileSize].Load()
	if off > size || length > size-off {
		return nil, false
	}
	mem := l.place.mapping(l, me[mrFD].Load(), me[mrInode].Load(), size)
	if mem == nil {
		return nil, false
	}
	at := off + (addr - base)
	return mem[at : at+n : at+n], true
}

// copyPlace copies between w's local SGEs (or inline data) and remote; it
// reports false, having copied nothing, if a local SGE fails its check
// (the ring path then reports it).
func (q *qp) copyPlace(w *wqe, remote []byte) bool {
	if w.wr.Op == verbs.OpWrite && w.wr.Flags&verbs.Inline != 0 {
		copy(remote, w.inline)
		return true
	}
	need := verbs.Access(0)
	if w.wr.Op == verbs.OpRead {
		need = verbs.AccessLocalWrite
	}
	var held [4]*mr
	var bufs [4][]byte
	if len(w.wr.SGL) > len(held) {
		return false
	}
	for i, s := range w.wr.SGL {
		m, b, ok := q.node.acquire(s.LKey, q.pd, s.Addr, uint64(s.Length), need)
		if !ok {
			for _, h := range held[:i] {
				h.done()
			}
			return false
		}
		held[i], bufs[i] = m, b
	}
	for i := range w.wr.SGL {
		if w.wr.Op == verbs.OpRead {
			remote = remote[copy(bufs[i], remote):]
		} else {
			remote = remote[copy(remote, bufs[i]):]
		}
		held[i].done()
	}
	return true
}

// closePlace ends in-place access over l, for finish: no copy of the peer
// starts after the mark, and the ones running end (or the peer exits);
// then this side's mappings of the peer go.
func (l *shmLink) closePlace() {
	l.seg.closing().Swap(1)
	l.fencePeer()
	l.segMu.Lock()
	l.segGone = true
	l.place.unmapAll(true)
	l.segMu.Unlock()
	l.node.linkMu.Lock()
	delete(l.node.placing, l)
	l.node.linkMu.Unlock()
	if l.pidfd >= 0 {
		unix.Close(l.pidfd)
		l.pidfd = -1
	}
}

// watchPeer learns the peer's process from the link's socket, for mapping
// its files and knowing when it has exited.
func (l *shmLink) watchPeer() {
	l.pidfd = -1
	if cred, err := peerCred(l.conn); err == nil {
		l.pid = int(cred.Pid)
	}
	if l.pid > 0 {
		if fd, err := unix.PidfdOpen(l.pid, 0); err == nil {
			l.pidfd = fd
		}
	}
}
