package wire

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/krcore/krcore/verbs"
)

// Ring sizes, fixed by the protocol (powers of two).
const (
	SQEntries  = 256
	CQEntries  = 256
	MsgEntries = 32
	SQELen     = 64
	CQELen     = 16
	MsgHdrLen  = 64
	headerLen  = 4096
	lineLen    = 64
)

// Counters and flags in a VQ's header, one cache line each.
const (
	SQTail        = iota // client: SQEs published
	SQHead               // daemon: SQEs consumed
	CQTail               // daemon: CQEs published
	CQHead               // client: CQEs consumed
	Retired              // daemon: requests finished (unsignaled included)
	MsgTail              // daemon: messages published
	MsgHead              // client: messages consumed
	DaemonSleeps         // daemon sleeps on the doorbell (flag)
	DaemonFullCQ         // daemon waits for completion ring space (flag)
	DaemonFullMsg        // daemon waits for message ring space (flag)
	ClientCQ             // client sleeps on the completion bell (flag)
	ClientMsg            // client sleeps on the message bell (flag)
	CtlDone              // daemon: outcome of the last control SQE, (seq+1)<<8 | code
	ClientCtl            // client sleeps on the control bell (flag)
	ClientAny            // PopAnyWait callers that may sleep on the message bell for completions too (count)
	counters
)

// OpRecv is the SQE op that posts a receive buffer (PushRecv), beside
// verbs' opcodes.
const OpRecv = 0xfe

// OpConnectSQE is the SQE op that connects the VQ (Connect), beside verbs'
// opcodes: MR holds the node, Imm the port and FlagToPort asks for
// krcore.ConnectOptions{Port: Imm}. The daemon runs it in order with the SQEs around it and
// publishes its outcome in CtlDone, not on the completion ring.
const OpConnectSQE = 0xfd

// CtlResult packs a control SQE's outcome as CtlDone holds it: seq is the
// SQE's sequence number, code its error code (CodeOK ...).
func CtlResult(seq uint64, code uint8) uint64 { return (seq+1)<<8 | uint64(code) }

// CtlOutcome unpacks CtlDone: the sequence number of the control SQE it
// reports (ok false when none has finished yet) and its error code.
func CtlOutcome(v uint64) (seq uint64, code uint8, ok bool) {
	if v>>8 == 0 {
		return 0, 0, false
	}
	return v>>8 - 1, uint8(v), true
}

// SQE flags.
const (
	FlagUnsignaled = 1 << iota
	FlagToPort     // OpConnectSQE: connect to the port in Imm
)

// Message flags.
const (
	MsgInBuf  = 1 << iota // landed in the oldest posted receive buffer
	MsgHasImm             // carries immediate data
	// MsgWrite: the notification of a WRITE_WITH_IMM (krcore.Message.Write):
	// Len bytes were written into an exported region; no data follows
	// the header and no posted buffer was taken.
	MsgWrite
)

// RingSize is the length of a VQ's ring memfd for messages up to maxMsg.
func RingSize(maxMsg int) int {
	n := headerLen + SQEntries*SQELen + CQEntries*CQELen + MsgEntries*(MsgHdrLen+maxMsg)
	p := os.Getpagesize()
	return (n + p - 1) &^ (p - 1)
}

// Ring is a VQ's shared memory seen by one side.
type Ring struct {
	mem    []byte
	maxMsg int
}

// NewRing lays the rings over mem, which holds at least RingSize(maxMsg)
// bytes aligned to a page.
func NewRing(mem []byte, maxMsg int) (*Ring, error) {
	if len(mem) < RingSize(maxMsg) {
		return nil, fmt.Errorf("%w: ring memory of %d bytes, want %d", ErrMalformed, len(mem), RingSize(maxMsg))
	}
	return &Ring{mem: mem, maxMsg: maxMsg}, nil
}

// Ctr is one of the header's counters (SQTail ...).
func (r *Ring) Ctr(i int) *atomic.Uint64 {
	// The memory is page-aligned off-heap memory, so the cast is aligned
	// and the garbage collector never moves it.
	return (*atomic.Uint64)(unsafe.Pointer(&r.mem[i*lineLen]))
}

// SQE is one request on the submission ring.
type SQE struct {
	Op            uint8
	Flags         uint8
	Imm           uint32
	MR            uint64
	Off, Len      uint64
	Region        uint64
	RemoteOff     uint64
	Compare, Swap uint64
}

func (r *Ring) sqe(seq uint64) []byte {
	off := headerLen + int(seq%SQEntries)*SQELen
	return r.mem[off : off+SQELen]
}

// PutSQE writes the SQE of sequence number seq.
func (r *Ring) PutSQE(seq uint64, e *SQE) {
	b := r.sqe(seq)
	b[0], b[1], b[2], b[3] = e.Op, e.Flags, 0, 0
	le := binary.LittleEndian
	le.PutUint32(b[4:], e.Imm)
	le.PutUint64(b[8:], e.MR)
	le.PutUint64(b[16:], e.Off)
	le.PutUint64(b[24:], e.Len)
	le.PutUint64(b[32:], e.Region)
	le.PutUint64(b[40:], e.RemoteOff)
	le.PutUint64(b[48:], e.Compare)
	le.PutUint64(b[56:], e.Swap)
}

// GetSQE reads the SQE of sequence number seq.
func (r *Ring) GetSQE(seq uint64) SQE {
	b := r.sqe(seq)
	le := binary.LittleEndian
	return SQE{Op: b[0], Flags: b[1], Imm: le.Uint32(b[4:]), MR: le.Uint64(b[8:]), Off: le.Uint64(b[16:]),
		Len: le.Uint64(b[24:]), Region: le.Uint64(b[32:]), RemoteOff: le.Uint64(b[40:]),
		Compare: le.Uint64(b[48:]), Swap: le.Uint64(b[56:])}
}

// CQE is one completion: the request's sequence number and outcome.
type CQE struct {
	Seq    uint64
	Status verbs.Status
	Len    uint32
}

func (r *Ring) cqe(i uint64) []byte {
	off := headerLen + SQEntries*SQELen + int(i%CQEntries)*CQELen
	return r.mem[off : off+CQELen]
}

// PutCQE writes completion number i.
func (r *Ring) PutCQE(i uint64, e CQE) {
	b := r.cqe(i)
	binary.LittleEndian.PutUint64(b, e.Seq)
	binary.LittleEndian.PutUint32(b[8:], uint32(e.Status))
	binary.LittleEndian.PutUint32(b[12:], e.Len)
}

// GetCQE reads completion number i.
func (r *Ring) GetCQE(i uint64) CQE {
	b := r.cqe(i)
	return CQE{Seq: binary.LittleEndian.Uint64(b), Status: verbs.Status(binary.LittleEndian.Uint32(b[8:])),
		Len: binary.LittleEndian.Uint32(b[12:])}
}

// MsgHdr describes one received message.
type MsgHdr struct {
	Flags  uint32
	Status verbs.Status
	Len    uint32
	Imm    uint32
	From   uint64
	Port   uint32
}

func (r *Ring) msg(i uint64) []byte {
	size := MsgHdrLen + r.maxMsg
	off := headerLen + SQEntries*SQELen + CQEntries*CQELen + int(i%MsgEntries)*size
	return r.mem[off : off+size]
}

// PutMsg writes message number i; data is copied when the message did not
// land in a posted buffer.
func (r *Ring) PutMsg(i uint64, h MsgHdr, data []byte) {
	b := r.msg(i)
	le := binary.LittleEndian
	le.PutUint32(b, h.Flags)
	le.PutUint32(b[4:], uint32(h.Status))
	le.PutUint32(b[8:], h.Len)
	le.PutUint32(b[12:], h.Imm)
	le.PutUint64(b[16:], h.From)
	le.PutUint32(b[24:], h.Port)
	copy(b[MsgHdrLen:], data)
}

// GetMsg reads message number i; data aliases the ring (copy it before
// advancing MsgHead) and is nil for a message in a posted buffer and for
// a WRITE_WITH_IMM's notification.
func (r *Ring) GetMsg(i uint64) (MsgHdr, []byte) {
	b := r.msg(i)
	le := binary.LittleEndian
	h := MsgHdr{Flags: le.Uint32(b), Status: verbs.Status(le.Uint32(b[4:])), Len: le.Uint32(b[8:]),
		Imm: le.Uint32(b[12:]), From: le.Uint64(b[16:]), Port: le.Uint32(b[24:])}
	if h.Flags&(MsgInBuf|MsgWrite) != 0 {
		return h, nil
	}
	return h, b[MsgHdrLen : MsgHdrLen+min(int(h.Len), r.maxMsg)]
}
