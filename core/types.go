package core

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// NodeID names a node in the cluster; the MetaServer maps it to the node's
// fabric address and DC target.
type NodeID = uint64

// MR is memory registered with the runtime. Requests name local memory by
// MR and offset, so the runtime can check every range before it reaches a
// shared QP.
type MR struct {
	mr     verbs.MR
	rt     *Runtime // the runtime that registered it; nil for HandleMR
	access verbs.Access
	blk    *offheap.Block // memory RegMR allocated, freed on Deregister
	dead   atomic.Bool
	handle *Handle // set by HandleMR: registered by another API implementation
	buf    []byte  // the memory of a HandleMR

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
// Close released it: the memory RegMR allocated is unmapped then, and a
// slice of it would fault the process when touched.
func (m *MR) Bytes() []byte {
	switch {
	case m.mr == nil:
		return m.buf
	case m.freed.Load():
		return nil
	}
	return m.mr.Bytes()
}

// Len is the region's length.
func (m *MR) Len() int {
	if m.mr == nil {
		return len(m.buf)
	}
	return m.mr.Len()
}

// Range names n bytes at offset off of the MR, for a request.
func (m *MR) Range(off, n int) Local { return Local{MR: m, Off: off, Len: n} }

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
// allocated for it, once.
func (m *MR) release() error {
	m.released.Do(func() {
		m.freed.Store(true)
		m.rt.forget(m)
		m.relErr = m.mr.Close()
		if m.blk != nil {
			if err := m.blk.Close(); m.relErr == nil {
				m.relErr = err
			}
		}
	})
	return m.relErr
}

// Local is a range of a local MR.
type Local struct {
	MR  *MR
	Off int
	Len int
}

// Fits reports whether [Off, Off+Len) lies inside size bytes (an MR's
// Len), computed so that no Off or Len a caller forges can overflow into
// a false yes. The runtime and krcored's clients check ranges with it.
func (l Local) Fits(size int) bool {
	return l.Off >= 0 && l.Len >= 0 && l.Off <= size && l.Len <= size-l.Off
}

func (l Local) sge() verbs.SGE {
	return verbs.SGE{Addr: l.MR.mr.Addr() + uint64(l.Off), Length: uint32(l.Len), LKey: l.MR.mr.LKey()}
}

// Region is a remote memory region a node exported under a name, as a
// client learned it. It is an opaque handle on the runtime's own record of
// the grant (address, rkey, bounds, access), which nothing outside the
// runtime can make or change: requests name a Region and an offset, never
// a raw key, and a Region the runtime did not hand out (the zero value,
// another runtime's) is refused. Copies share the record.
type Region struct {
	g      *grant
	handle *Handle // set by HandleRegion: learned by another API implementation
}

// grant is what a runtime learned of an exported region; immutable once
// made. The exporter registered the region as its own MR covering exactly
// [addr, addr+len) with exactly access, so the rkey grants nothing else.
type grant struct {
	rt     *Runtime // the runtime that learned it; nil for HandleRegion
	node   NodeID
	name   string
	len    uint64
	access verbs.Access
	addr   uint64 // remote virtual address of byte 0
	rkey   uint32
}

// Node is the node that exports the region.
func (g *Region) Node() NodeID { return g.grant().node }

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
func (g *Region) At(off uint64) Remote { return Remote{Region: g, Off: off} }

// Remote is an offset in a remote region.
type Remote struct {
	Region *Region
	Off    uint64
}

// Request is one operation pushed on a VQ.
type Request struct {
	// ID comes back in the completion.
	ID uint64
	// Op is READ, WRITE, WRITE_WITH_IMM, SEND, SEND_WITH_IMM, CAS or FAA.
	Op verbs.Opcode
	// Local is the local buffer: the source of WRITE and SEND, the
	// destination of READ and of an atomic's original value (8 bytes).
	Local Local
	// Remote is the target of one-sided operations.
	Remote Remote
	// Imm is the immediate data of the _WITH_IMM operations. A
	// WRITE_WITH_IMM needs a VQ connected to a port (ToPort), as a SEND
	// does (else it completes with LOC_QP_OP_ERR): the VQ bound to that
	// port receives its notification (Message.Write) once the bytes are
	// in place.
	Imm uint32
	// Compare and Swap are CAS's operands; Compare is FAA's addend.
	Compare, Swap uint64
	// Unsignaled requests produce no completion on success; they are
	// retired when a later signaled request on the VQ completes.
	Unsignaled bool
}

// Completion reports the outcome of a request.
type Completion struct {
	ID     uint64
	Op     verbs.Opcode
	Status verbs.Status
	// Len is the number of bytes the operation moved.
	Len int
}

// Err returns nil on success, otherwise an error matching the status with
// errors.Is.
func (c *Completion) Err() error {
	if c.Status == verbs.Success {
		return nil
	}
	return fmt.Errorf("core: request %d (%s): %w", c.ID, c.Op, c.Status)
}

// Message is a two-sided message received on a bound port, or the
// notification of a WRITE_WITH_IMM sent to it (Write).
type Message struct {
	// Buf is the posted receive buffer the message landed in (its first
	// Len bytes), or nil when it arrived before any buffer was posted and
	// Data holds a copy.
	Buf  *Local
	Data []byte
	// Len is the message's length, or for a notification the number of
	// bytes written.
	Len int
	// From is the sender's node and the port it is bound to (0 if none),
	// the address to reply to.
	From NodeID
	Port uint32
	// Imm is the immediate of a SEND_WITH_IMM or WRITE_WITH_IMM (HasImm).
	Imm    uint32
	HasImm bool
	// Write marks the notification of a WRITE_WITH_IMM: Len bytes were
	// written into a region this node exported, and were in place before
	// the notification arrived. It has no payload: Buf and Data are nil
	// and it takes no posted receive buffer. It arrives in order with the
	// port's messages, and HasImm is always set.
	Write bool
	// Status is LOC_LEN_ERR when the message did not fit Buf (it is cut).
	Status verbs.Status
}
