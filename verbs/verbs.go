// Package verbs is krcore's provider-neutral RDMA verbs API.
//
// It mirrors libibverbs closely enough that a reader who knows ibv_* finds
// each call (ibv_alloc_pd is PD, ibv_reg_mr is PD.RegMR, ibv_post_send is
// QP.PostSend, ibv_poll_cq is CQ.Poll ...) while being idiomatic Go: errors
// instead of errno, interfaces at the provider seam, context for blocking
// waits. Two providers implement it: provider/soft, a pure-Go software RNIC
// that runs anywhere and is the ground truth of every test, and
// provider/ibverbs, rdma-core's libibverbs behind the build tag rdma.
//
// Memory registered with an RNIC must be off the Go heap (package offheap):
// the NIC writes it asynchronously, and C must never hold Go pointers.
//
// Behaviour every provider must show is fixed by the conformance suite in
// verbs/conformance: remote access is checked by the target on every
// operation, a violation completes with REM_ACCESS_ERR and moves the
// requester QP to ERR, later work requests flush with WR_FLUSH_ERR, and so on.
package verbs

import "context"

// Provider opens RNIC devices.
type Provider interface {
	// Name identifies the provider ("soft", "ibverbs").
	Name() string
	// Devices lists the names of the devices Open accepts.
	Devices() ([]string, error)
	// Open opens a device by name; "" opens the provider's default device.
	Open(ctx context.Context, name string) (Device, error)
}

// Device is an open RNIC context (ibv_context): the root of every resource.
// Closing a device closes everything created from it.
type Device interface {
	// Name is the device name (a soft node's address, "rxe0" ...).
	Name() string
	// Attr reports the device's limits.
	Attr() DeviceAttr
	// Port reports the identity and state of the device's (single) port.
	Port() PortAttr
	// AllocPD allocates a protection domain.
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue holding at least cqe entries.
	CreateCQ(cqe int) (CQ, error)
	// Close releases the device and every resource made from it. Work in
	// flight completes with WR_FLUSH_ERR or is dropped.
	Close() error
}

// PD is a protection domain: MRs and QPs only work together when they belong
// to the same PD.
type PD interface {
	// RegMR registers buf, which must be off-heap memory, for local and
	// remote access. Keys are unpredictable.
	RegMR(buf []byte, access Access) (MR, error)
	// CreateQP creates a queue pair in the RESET state.
	CreateQP(init QPInit) (QP, error)
	// CreateSRQ creates a shared receive queue.
	CreateSRQ(init SRQInit) (SRQ, error)
	// CreateAH creates an address handle for UD and DC sends.
	CreateAH(attr AHAttr) (AH, error)
	// Close deallocates the PD. It fails with ErrBusy while MRs, QPs, SRQs
	// or AHs made from it are open.
	Close() error
}

// MR is a registered memory region.
type MR interface {
	// LKey is the key local SGEs name the region by.
	LKey() uint32
	// RKey is the key a remote peer names the region by.
	RKey() uint32
	// Addr is the virtual address of the region's first byte, the address
	// SGEs and remote operations use.
	Addr() uint64
	// Len is the region's length in bytes.
	Len() int
	// Bytes is the registered memory itself.
	Bytes() []byte
	// Access is the region's access flags.
	Access() Access
	// Close deregisters the region. Remote operations that arrive later
	// fail with REM_ACCESS_ERR on their requester.
	Close() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wc) completions into wc and returns how many.
	// It never blocks. It fails with ErrCQOverrun once the CQ overflowed.
	Poll(wc []WC) (int, error)
	// Wait blocks until a completion is ready for Poll, the CQ fails, or
	// ctx ends (the channel-based ibv_req_notify_cq/ibv_get_cq_event pair).
	Wait(ctx context.Context) error
	// Cap is the number of completions the CQ holds.
	Cap() int
	// Close destroys the CQ. It fails with ErrBusy while QPs use it.
	Close() error
}

// QP is a queue pair of type RC, UC, UD, DCI or DCT.
type QP interface {
	// Num is the QP number (for a DCT, the DCT number peers send to).
	Num() uint32
	// Type is the transport type.
	Type() QPType
	// State is the current state.
	State() QPState
	// Endpoint is the identity a peer needs to reach this QP: exchange it
	// out of band and pass it to the peer's Modify(RTR).
	Endpoint() Endpoint
	// Modify moves the QP through RESET -> INIT -> RTR -> RTS, to ERR, or
	// back to RESET, applying the attributes the target state needs.
	Modify(attr QPAttr) error
	// PostSend queues work requests on the send queue. It returns how many
	// were accepted; on error wr[n] is the one that was refused.
	PostSend(wr []SendWR) (int, error)
	// PostRecv queues receive buffers (not for QPs that use an SRQ).
	PostRecv(wr []RecvWR) (int, error)
	// Close destroys the QP. Outstanding work is dropped.
	Close() error
}

// SRQ is a shared receive queue.
type SRQ interface {
	// PostRecv queues receive buffers shared by every QP using the SRQ.
	PostRecv(wr []RecvWR) (int, error)
	// Close destroys the SRQ. It fails with ErrBusy while QPs use it.
	Close() error
}

// AH is an address handle naming a remote port for UD and DC sends.
type AH interface {
	// Dest is the port the handle names.
	Dest() Endpoint
	// Close destroys the handle.
	Close() error
}
