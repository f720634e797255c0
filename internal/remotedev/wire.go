package remotedev

import (
	"strconv"
	"time"

	"github.com/krcore/krcore/verbs"
)

// op names a remote call. The numbers are the protocol: append, never
// renumber.
type op uint8

const (
	opHello op = iota + 1
	opPort
	opCloseDevice
	opAllocPD
	opCreateCQ
	opClose // any handle
	opRegMR
	opCreateQP
	opCreateSRQ
	opCreateAH
	opPoll
	opWait
	opQPState
	opQPEndpoint
	opModify
	opPostSend
	opPostRecv
	opSRQPostRecv
	opControl
)

var opNames = [...]string{
	opHello: "hello", opPort: "port", opCloseDevice: "close device",
	opAllocPD: "alloc PD", opCreateCQ: "create CQ", opClose: "close",
	opRegMR: "reg MR", opCreateQP: "create QP", opCreateSRQ: "create SRQ",
	opCreateAH: "create AH", opPoll: "poll CQ", opWait: "wait CQ",
	opQPState: "QP state", opQPEndpoint: "QP endpoint", opModify: "modify QP",
	opPostSend: "post send", opPostRecv: "post recv",
	opSRQPostRecv: "post SRQ recv", opControl: "control",
}

func (o op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// protocolVersion is checked by the hello exchange so mismatched binaries
// fail at connect time rather than with confusing decode errors.
const protocolVersion = 1

// request is one call. Only the fields the op reads are set; gob omits the
// rest. A fresh request is decoded each time, since gob leaves absent
// fields untouched.
type request struct {
	Seq     uint64
	Op      op
	Version int           // hello
	H       uint64        // the object the call is on
	N       int           // CQ entries, poll count
	Timeout time.Duration // wait slice
	Access  verbs.Access
	Mem     *memRef
	QPInit  *qpInit
	SRQInit *verbs.SRQInit
	AHAttr  *verbs.AHAttr
	QPAttr  *verbs.QPAttr
	Send    []sendWR
	Recv    []verbs.RecvWR
	Name    string // control
	Data    []byte // control
}

// response answers the request with the same Seq.
type response struct {
	Seq      uint64
	Err      *wireError
	H        uint64 // handle of a created object
	N        int    // accepted WRs, CQ capacity
	Ready    bool   // wait: a completion is ready
	Hello    *hello
	Port     *verbs.PortAttr
	MR       *mrInfo
	QP       *qpInfo
	State    verbs.QPState
	Endpoint *verbs.Endpoint
	WC       []verbs.WC
	Dest     *verbs.Endpoint // AH
	Data     []byte
}

// hello describes the served device once, for the values that never change.
type hello struct {
	Version int
	Name    string
	Attr    verbs.DeviceAttr
	PID     int
}

// memRef names a byte range of a client's memfd-backed block.
type memRef struct {
	PID  int    // client process, whose /proc/PID/fd/FD is the memfd
	FD   int    // the block's memfd in the client
	Dev  uint64 // st_dev and st_ino of the memfd: the block's identity,
	Ino  uint64 // which outlives fd-number reuse
	Size int    // block length
	Off  int    // range start within the block
	Len  int    // range length
}

// mrInfo is what the server's RNIC says about a registration.
type mrInfo struct {
	LKey, RKey uint32
	Addr       uint64
	Len        int
	Access     verbs.Access
}

// qpInit is verbs.QPInit with objects replaced by handles (0 for nil).
type qpInit struct {
	Type      verbs.QPType
	SendCQ    uint64
	RecvCQ    uint64
	SRQ       uint64
	Cap       verbs.QPCap
	SignalAll bool
	DCKey     uint64
}

// qpInfo is what the client caches about a created QP.
type qpInfo struct {
	Num  uint32
	Type verbs.QPType
}

// sendWR is verbs.SendWR with the AH replaced by its handle.
type sendWR struct {
	ID         uint64
	Op         verbs.Opcode
	Flags      verbs.SendFlags
	SGL        []verbs.SGE
	Imm        uint32
	RemoteAddr uint64
	RKey       uint32
	CompareAdd uint64
	Swap       uint64
	AH         uint64
	RemoteQPN  uint32
	QKey       uint32
	DCKey      uint64
}

func toWire(wr *verbs.SendWR, ah uint64) sendWR {
	return sendWR{
		ID: wr.ID, Op: wr.Op, Flags: wr.Flags, SGL: wr.SGL, Imm: wr.Imm,
		RemoteAddr: wr.RemoteAddr, RKey: wr.RKey, CompareAdd: wr.CompareAdd,
		Swap: wr.Swap, AH: ah, RemoteQPN: wr.RemoteQPN, QKey: wr.QKey, DCKey: wr.DCKey,
	}
}

func (w *sendWR) verbs(ah verbs.AH) verbs.SendWR {
	return verbs.SendWR{
		ID: w.ID, Op: w.Op, Flags: w.Flags, SGL: w.SGL, Imm: w.Imm,
		RemoteAddr: w.RemoteAddr, RKey: w.RKey, CompareAdd: w.CompareAdd,
		Swap: w.Swap, AH: ah, RemoteQPN: w.RemoteQPN, QKey: w.QKey, DCKey: w.DCKey,
	}
}
