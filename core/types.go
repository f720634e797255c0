package core

import (
	"sync"
	"sync/atomic"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// MR is memory registered with the runtime. Requests name local memory by
// MR and offset, so the runtime can check every range before it reaches a
// shared QP.
type MR struct {
	mr     verbs.MR
	rt     *Runtime // the runtime that registered it
	access verbs.Access
	blk    *offheap.Block // memory RegMR allocated, freed on Deregister
	dead   atomic.Bool
	// addr, lkey and n are mr's, read once at registration: every
	// request's checks and scatter-gather entry use them, and asking the
	// provider through verbs.MR cost three dynamic calls per request.
	addr uint64
	lkey uint32
	n    int
	// mem is mr's memory, read once at registration like addr, for the
	// runtime's own copies where the memory cannot be released under
	// them: an MR something holds a use of (a request, a posted receive
	// buffer), the receive slots (which only the runtime's Close
	// releases, retiring the memory rather than unmapping it) and a QP's
	// header slots (released when the QP is destroyed, which every
	// writer of them rules out: see pqp.header). A message's copies then
	// cost no dynamic call. Bytes is the checked way for the rest.
	mem []byte

	// uses counts what may still make the RNIC or the runtime touch the
	// memory: requests accepted and not finished, receive buffers posted
	// and not filled. Deregister leaves the registration and the memory to
	// them (see Runtime.Deregister).
	uses     atomic.Int64
	drained  atomic.Pointer[Queue] // Deregister's stand-in waiter, kicked when uses reaches 0
	deferred atomic.Bool           // Deregister gave up waiting: the last use releases
	released sync.Once
	relErr   error       // of the release, set inside released
	freed    atomic.Bool // released: the memory may be unmapped
}

// Bytes is the registered memory, or nil once Deregister or the runtime's
// Close released it. Deregister unmaps the memory RegMR allocated (a slice
// of it still held would fault the process when touched); the runtime's
// Close retires it (offheap.Block.Retire) instead: slices that a layer
// above still holds when the runtime closes under it read zeros and write
// into nothing, without faulting.
func (m *MR) Bytes() []byte {
	if m.freed.Load() {
		return nil
	}
	return m.mr.Bytes()
}

// Len is the region's length.
func (m *MR) Len() int { return m.n }

// Range names n bytes at offset off of the MR, for a request.
func (m *MR) Range(off, n int) krcore.Local { return krcore.Local{MR: m, Off: off, Len: n} }

func (m *MR) live() bool { return !m.dead.Load() }

// use holds m for a request or a receive buffer; it fails once m is
// deregistered. Increment first, then look: Deregister marks m dead first,
// then looks at uses, so one of the two sees the other.
func (m *MR) use() bool {
	m.uses.Add(1)
	if m.dead.Load() {
		m.unuse()
		return false
	}
	return true
}

// unuse drops a hold of use. The last one on a deregistered MR wakes
// Deregister, or releases m itself if Deregister stopped waiting.
func (m *MR) unuse() {
	if m.uses.Add(-1) != 0 || !m.dead.Load() {
		return
	}
	if w := m.drained.Load(); w != nil {
		m.rt.kick(w)
	}
	if m.deferred.Load() {
		m.release()
	}
}

// release deregisters m from the device and frees the memory RegMR
// allocated for it, once: unmapped, or retired when the runtime closes.
func (m *MR) release() error {
	m.released.Do(func() {
		m.freed.Store(true)
		m.rt.forget(m)
		m.relErr = m.mr.Close()
		if m.blk != nil {
			free := m.blk.Close
			if m.rt.closedErr("release") != nil {
				free = m.blk.Retire
			}
			if err := free(); m.relErr == nil {
				m.relErr = err
			}
		}
	})
	return m.relErr
}

// sge is the scatter-gather entry of l, whose MR the caller checked is m.
func sge(m *MR, l krcore.Local) verbs.SGE {
	return verbs.SGE{Addr: m.addr + uint64(l.Off), Length: uint32(l.Len), LKey: m.lkey}
}

// Region is a remote memory region a node exported under a name, as a
// client learned it. It is an opaque handle on the runtime's own record of
// the grant (address, rkey, bounds, access), which nothing outside the
// runtime can make or change: requests name a Region and an offset, never
// a raw key, and a Region the runtime did not hand out (the zero value,
// another runtime's) is refused. Copies share the record.
type Region struct {
	g *grant
}

// grant is what a runtime learned of an exported region; immutable once
// made. The exporter registered the region as its own MR covering exactly
// [addr, addr+len) with exactly access, so the rkey grants nothing else.
type grant struct {
	rt     *Runtime // the runtime that learned it
	node   krcore.NodeID
	name   string
	len    uint64
	access verbs.Access
	addr   uint64 // remote virtual address of byte 0
	rkey   uint32
}

// Node is the node that exports the region.
func (g *Region) Node() krcore.NodeID { return g.grant().node }

// Name is the name the region is exported under.
func (g *Region) Name() string { return g.grant().name }

// Len is the region's length in bytes.
func (g *Region) Len() uint64 { return g.grant().len }

// Access is the remote access the exporter granted.
func (g *Region) Access() verbs.Access { return g.grant().access }

// noGrant stands for the record of a Region the runtime did not hand out.
var noGrant grant

// grant is g's record, or an empty one (never nil).
func (g *Region) grant() *grant {
	if g == nil || g.g == nil {
		return &noGrant
	}
	return g.g
}

// At names offset off of the region, for a request.
func (g *Region) At(off uint64) krcore.Remote { return krcore.Remote{Region: g, Off: off} }
