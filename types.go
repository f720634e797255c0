package krcore

import (
	"fmt"

	"github.com/krcore/krcore/verbs"
)

// NodeID names a node in the cluster; the MetaServer maps it to the node's
// fabric address and DC target. Zero names no node.
type NodeID = uint64

// MR is memory registered with a runtime (API.RegMR, API.Register): an
// opaque handle. Requests name local memory by MR and offset so that the
// runtime checks every range before it reaches a shared QP; an MR made by
// another runtime, or implemented by the caller, is refused.
type MR interface {
	// Bytes is the registered memory, or nil once it was deregistered or
	// its runtime closed: the memory may be unmapped then.
	Bytes() []byte
	// Len is the length in bytes.
	Len() int
	// Access is the access the memory was registered with.
	Access() verbs.Access
	// Range names n bytes at offset off, for a request.
	Range(off, n int) Local
}

// Region is a remote memory region a node exported under a name, as a
// runtime learned it (API.Region, VQ.Region): an opaque handle on the
// runtime's own record of the grant, which the caller can neither see nor
// change. A Region another runtime handed out, or implemented by the
// caller, is refused.
type Region interface {
	// Node is the node that exports the region.
	Node() NodeID
	// Name is the name it is exported under.
	Name() string
	// Len is its length in bytes.
	Len() uint64
	// Access is the remote access the exporter granted.
	Access() verbs.Access
	// At names offset off of the region, for a request.
	At(off uint64) Remote
}

// Forgetter is a Region whose runtime keeps something for it until told
// otherwise: a region learned through krcored is an entry in the daemon,
// held until the client detaches. Forget drops it; requests naming the
// region afterwards are refused. A Region learned in process holds nothing
// beyond itself and is not a Forgetter.
type Forgetter interface {
	Region
	Forget() error
}

// Forget forgets r if it is a Forgetter; any other Region holds nothing to
// forget. It does not wait for krcored.
func Forget(r Region) error {
	if f, ok := r.(Forgetter); ok {
		return f.Forget()
	}
	return nil
}

// Local is a range of a local MR.
type Local struct {
	MR  MR
	Off int
	Len int
}

// Fits reports whether [Off, Off+Len) lies inside size bytes (an MR's
// Len), computed so that no Off or Len a caller forges can overflow into a
// false yes.
func (l Local) Fits(size int) bool {
	return l.Off >= 0 && l.Len >= 0 && l.Off <= size && l.Len <= size-l.Off
}

// Remote is an offset in a remote region.
type Remote struct {
	Region Region
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
	// WRITE_WITH_IMM needs a VQ connected to a port (ConnectOptions.Port),
	// as a SEND does (else it completes with LOC_QP_OP_ERR): the VQ bound
	// to that port receives its notification (Message.Write) once the
	// bytes are in place.
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
	return fmt.Errorf("krcore: request %d (%s): %w", c.ID, c.Op, c.Status)
}

// Message is a two-sided message received on a bound port, or the
// notification of a WRITE_WITH_IMM (Write).
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

// Stats counts what the runtime did, for metrics and tests.
type Stats struct {
	Connects, ColdConnects, Refusals, Recoveries, PostErrors uint64
	RCBuilt, RCEvicted, Migrations, StaleTargets, Dropped    uint64
	// PeersDead counts the times a peer was found dead (see ErrPeerDead).
	PeersDead uint64
	// WriteImms counts raw WRITE_WITH_IMM receive completions, from a
	// writer that is not a krcore runtime (a runtime's WRITE_WITH_IMM
	// arrives as a notification, Message.Write): consumed, not delivered
	// to any VQ.
	WriteImms      uint64
	DCIs, RCs, VQs int
	// RCOnly reports that the runtime runs without DC.
	RCOnly bool
}
