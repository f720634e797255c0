package verbs

import "fmt"

// SGE is a scatter/gather entry: Length bytes at virtual address Addr inside
// the local MR whose key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SGEOf returns the SGE for length bytes at offset off of mr.
func SGEOf(mr MR, off, length int) SGE {
	return SGE{Addr: mr.Addr() + uint64(off), Length: uint32(length), LKey: mr.LKey()}
}

// SendWR is a send work request (ibv_send_wr).
type SendWR struct {
	// ID comes back in the work completion.
	ID uint64
	// Op is the operation.
	Op Opcode
	// Flags are Signaled, Inline, Fence, Solicited.
	Flags SendFlags
	// SGL is the local data: gathered for SEND/WRITE, scattered for READ
	// and atomics (one 8-byte SGE receiving the original remote value).
	SGL []SGE
	// Imm is the immediate data of SEND_WITH_IMM and RDMA_WRITE_WITH_IMM.
	Imm uint32
	// RemoteAddr and RKey name the remote memory of one-sided operations.
	RemoteAddr uint64
	RKey       uint32
	// CompareAdd is the compare value of CAS and the addend of FAA; Swap
	// is the new value of CAS.
	CompareAdd uint64
	Swap       uint64
	// AH, RemoteQPN and QKey address a UD send; AH, RemoteQPN (the DCT
	// number) and DCKey address a DCI send.
	AH        AH
	RemoteQPN uint32
	QKey      uint32
	DCKey     uint64
}

// Len is the total length of the request's scatter/gather list.
func (wr *SendWR) Len() int {
	n := 0
	for _, s := range wr.SGL {
		n += int(s.Length)
	}
	return n
}

// RecvWR is a receive work request (ibv_recv_wr).
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WC is a work completion (ibv_wc).
type WC struct {
	// ID is the work request's ID.
	ID uint64
	// Status is Success or the reason the request failed.
	Status Status
	// Op is the completed operation (valid when Status is Success, and
	// always for receive completions).
	Op WCOpcode
	// ByteLen is the number of bytes received (receives) or transferred.
	ByteLen uint32
	// Imm is the immediate data, valid when HasImm.
	Imm    uint32
	HasImm bool
	// QPN is the local QP the completion belongs to.
	QPN uint32
	// SrcQPN is the sender's QP number on UD receives.
	SrcQPN uint32
}

// Err returns nil for a successful completion and an error that matches the
// Status with errors.Is otherwise.
func (wc *WC) Err() error {
	if wc.Status == Success {
		return nil
	}
	return &CompletionError{ID: wc.ID, QPN: wc.QPN, Status: wc.Status}
}

// CompletionError is a failed work completion as an error.
type CompletionError struct {
	ID     uint64
	QPN    uint32
	Status Status
}

// Error names the work request, its QP and its status.
func (e *CompletionError) Error() string {
	return fmt.Sprintf("verbs: work request %d on QP %d completed with %s", e.ID, e.QPN, e.Status)
}

// Unwrap returns the Status, so errors.Is(err, verbs.RemAccessErr) works.
func (e *CompletionError) Unwrap() error { return e.Status }
