package verbs

import (
	"fmt"
	"strings"
)

// QPType is a QP's transport.
type QPType uint8

// Transports. DCI and DCT are the two halves of Dynamically Connected
// transport: one DCI reaches any DCT given its node, number and access key.
const (
	RC  QPType = iota + 1 // reliable connected
	UC                    // unreliable connected
	UD                    // unreliable datagram
	DCI                   // dynamically connected initiator
	DCT                   // dynamically connected target
)

// String is the transport's name: RC, UC, UD, DCI, DCT.
func (t QPType) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	case DCI:
		return "DCI"
	case DCT:
		return "DCT"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// QPState is a QP's state.
type QPState uint8

// QP states, in ibv_qp_state order.
const (
	StateReset QPState = iota
	StateInit
	StateRTR
	StateRTS
	StateSQD
	StateSQE
	StateErr
)

// String is the state's name as the verbs spell it: RESET, INIT, RTR, RTS, SQD, SQE, ERR.
func (s QPState) String() string {
	switch s {
	case StateReset:
		return "RESET"
	case StateInit:
		return "INIT"
	case StateRTR:
		return "RTR"
	case StateRTS:
		return "RTS"
	case StateSQD:
		return "SQD"
	case StateSQE:
		return "SQE"
	case StateErr:
		return "ERR"
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// Opcode is a send work request's operation.
type Opcode uint8

// Send opcodes.
const (
	OpSend Opcode = iota + 1
	OpSendImm
	OpWrite
	OpWriteImm
	OpRead
	OpCompareSwap
	OpFetchAdd
)

var opcodeNames = [...]string{
	OpSend: "SEND", OpSendImm: "SEND_WITH_IMM", OpWrite: "RDMA_WRITE",
	OpWriteImm: "RDMA_WRITE_WITH_IMM", OpRead: "RDMA_READ",
	OpCompareSwap: "ATOMIC_CMP_AND_SWP", OpFetchAdd: "ATOMIC_FETCH_AND_ADD",
}

// String is the opcode's name.
func (o Opcode) String() string {
	if int(o) < len(opcodeNames) && opcodeNames[o] != "" {
		return opcodeNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// Valid reports whether o is a known opcode.
func (o Opcode) Valid() bool { return o >= OpSend && o <= OpFetchAdd }

// IsAtomic reports whether o is an 8-byte atomic.
func (o Opcode) IsAtomic() bool { return o == OpCompareSwap || o == OpFetchAdd }

// HasImm reports whether o carries immediate data.
func (o Opcode) HasImm() bool { return o == OpSendImm || o == OpWriteImm }

// IsSend reports whether o is two-sided (consumes a receive).
func (o Opcode) IsSend() bool { return o == OpSend || o == OpSendImm }

// Supports reports whether transport t can carry opcode o, as hardware
// defines it: UD carries only sends, UC no reads or atomics.
func (t QPType) Supports(o Opcode) bool {
	switch t {
	case RC, DCI:
		return o.Valid()
	case UC:
		return o == OpSend || o == OpSendImm || o == OpWrite || o == OpWriteImm
	case UD:
		return o == OpSend || o == OpSendImm
	}
	return false
}

// WCOpcode is the operation a work completion reports.
type WCOpcode uint8

// Completion opcodes.
const (
	WCSend WCOpcode = iota + 1
	WCWrite
	WCRead
	WCCompareSwap
	WCFetchAdd
	WCRecv
	WCRecvWriteImm
)

var wcOpcodeNames = [...]string{
	WCSend: "SEND", WCWrite: "RDMA_WRITE", WCRead: "RDMA_READ",
	WCCompareSwap: "COMP_SWAP", WCFetchAdd: "FETCH_ADD", WCRecv: "RECV",
	WCRecvWriteImm: "RECV_RDMA_WITH_IMM",
}

// String is the completion opcode's name.
func (o WCOpcode) String() string {
	if int(o) < len(wcOpcodeNames) && wcOpcodeNames[o] != "" {
		return wcOpcodeNames[o]
	}
	return fmt.Sprintf("WCOpcode(%d)", uint8(o))
}

// CompletionOf is the completion opcode a successful send of o reports.
func CompletionOf(o Opcode) WCOpcode {
	switch o {
	case OpSend, OpSendImm:
		return WCSend
	case OpWrite, OpWriteImm:
		return WCWrite
	case OpRead:
		return WCRead
	case OpCompareSwap:
		return WCCompareSwap
	case OpFetchAdd:
		return WCFetchAdd
	}
	return 0
}

// Access is a set of memory or QP access rights.
type Access uint32

// Access flags (ibv_access_flags).
const (
	AccessLocalWrite   Access = 1 << 0
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
	// AccessAll grants every right.
	AccessAll = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
)

// String is the flags' names joined by "|" (NONE for none), unknown bits in hex.
func (a Access) String() string {
	if a == 0 {
		return "NONE"
	}
	var parts []string
	for _, f := range []struct {
		bit  Access
		name string
	}{{AccessLocalWrite, "LOCAL_WRITE"}, {AccessRemoteWrite, "REMOTE_WRITE"}, {AccessRemoteRead, "REMOTE_READ"}, {AccessRemoteAtomic, "REMOTE_ATOMIC"}} {
		if a&f.bit != 0 {
			parts = append(parts, f.name)
		}
	}
	if rest := a &^ AccessAll; rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint32(rest)))
	}
	return strings.Join(parts, "|")
}

// SendFlags modify a send work request.
type SendFlags uint8

// Send flags (ibv_send_flags).
const (
	// Signaled asks for a completion even on success.
	Signaled SendFlags = 1 << iota
	// Inline copies the payload at post time; the SGEs need no lkey.
	Inline
	// Fence waits for earlier READs and atomics to finish first.
	Fence
	// Solicited asks the receiver to raise a solicited event.
	Solicited
)

// Status is a work completion's status. A non-success Status is an error
// whose text is the verbs status name, so callers can test a completion
// error with errors.Is(err, verbs.RemAccessErr).
type Status uint8

// Work completion statuses, numbered as ibv_wc_status.
const (
	Success Status = iota
	LocLenErr
	LocQPOpErr
	LocEECOpErr
	LocProtErr
	WRFlushErr
	MWBindErr
	BadRespErr
	LocAccessErr
	RemInvReqErr
	RemAccessErr
	RemOpErr
	RetryExcErr
	RNRRetryExcErr
	LocRDDViolErr
	RemInvRDReqErr
	RemAbortErr
	InvEECNErr
	InvEECStateErr
	FatalErr
	RespTimeoutErr
	GeneralErr
)

var statusNames = [...]string{
	"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
	"WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR",
	"REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR",
	"RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR",
	"REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR",
	"RESP_TIMEOUT_ERR", "GENERAL_ERR",
}

// String is the status's name as libibverbs spells it (REM_ACCESS_ERR), or Status(N).
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Error returns the status name.
func (s Status) Error() string { return s.String() }

// ParseStatus returns the Status named name ("REM_ACCESS_ERR").
func ParseStatus(name string) (Status, error) {
	for i, n := range statusNames {
		if n == name {
			return Status(i), nil
		}
	}
	return 0, fmt.Errorf("verbs: unknown status %q", name)
}
