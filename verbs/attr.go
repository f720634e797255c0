package verbs

import "time"

// DeviceAttr is a device's limits (ibv_device_attr).
type DeviceAttr struct {
	MaxQP        int    // QPs the device can hold
	MaxQPWR      int    // work requests per send or receive queue
	MaxSGE       int    // SGEs per work request
	MaxCQ        int    // CQs
	MaxCQE       int    // entries per CQ
	MaxMR        int    // MRs
	MaxMRSize    uint64 // bytes per MR
	MaxPD        int    // PDs
	MaxSRQ       int    // SRQs
	MaxSRQWR     int    // work requests per SRQ
	MaxInline    int    // bytes of inline data per send
	MaxMsgSize   uint32 // bytes per RC message
	AtomicCap    bool   // 8-byte CAS and FAA supported
	DCSupported  bool   // DCI/DCT supported
	SRQSupported bool
	// ProgressInWait reports that completions come sooner to a goroutine
	// waiting in CQ.Wait than to one polling: the device makes progress in
	// the thread that waits (a software RNIC whose waiter reads the wire
	// itself), so a poller that spins only delays them. On a hardware RNIC
	// completions land in memory by DMA and spinning pays.
	ProgressInWait bool
}

// PortAttr is a device port's identity and state (ibv_port_attr plus GID).
type PortAttr struct {
	// Num is the port number (1-based as in verbs).
	Num int
	// Active reports the link is up.
	Active bool
	// MTU is the active path MTU in bytes (UD's message limit).
	MTU int
	// LID is the InfiniBand local identifier (0 on RoCE and soft).
	LID uint16
	// GID is the port's global identifier.
	GID GID
	// GIDIndex is the GID table index the provider uses.
	GIDIndex int
	// Addr is the fabric address peers reach the port by, for providers
	// whose addresses are not GIDs (the soft RNIC's "host:port").
	Addr string
}

// QPCap sizes a QP's queues.
type QPCap struct {
	MaxSendWR  int
	MaxRecvWR  int
	MaxSendSGE int
	MaxRecvSGE int
	MaxInline  int
}

// QPInit describes a QP to create (ibv_qp_init_attr).
type QPInit struct {
	Type   QPType
	SendCQ CQ
	RecvCQ CQ
	// SRQ, if set, supplies receives instead of the QP's own queue. A DCT
	// needs one.
	SRQ SRQ
	Cap QPCap
	// SignalAll makes every send signaled.
	SignalAll bool
	// DCKey is a DCT's access key: DCI sends must carry it.
	DCKey uint64
}

// SRQInit describes a shared receive queue.
type SRQInit struct {
	MaxWR  int
	MaxSGE int
}

// AHAttr describes an address handle.
type AHAttr struct {
	// Dest is the remote port (its GID, LID or Addr; QPN and PSN unused).
	Dest Endpoint
}

// QPAttr are the attributes a state change applies (ibv_qp_attr). Only the
// fields CheckTransition names for the step (its QPAttrMask) are read.
type QPAttr struct {
	// State is the target state.
	State QPState
	// Access is the remote access the QP allows (INIT; RC, UC, DCT).
	Access Access
	// QKey is a UD QP's queue key (INIT).
	QKey uint32
	// Dest is the remote QP of an RC or UC QP and the first PSN expected
	// from it (RTR).
	Dest Endpoint
	// MTU is the path MTU in bytes (RTR); 0 means the port MTU.
	MTU int
	// MinRNRTimer is how long a sender waits before retrying a SEND this QP
	// had no receive for (RTR); 0 means the provider default.
	MinRNRTimer time.Duration
	// SQPSN is the first PSN this QP sends (RTS).
	SQPSN uint32
	// Timeout is the local ACK timeout per retry (RTS); 0 means the
	// provider default.
	Timeout time.Duration
	// RetryCount is how often a request is retried before RETRY_EXC_ERR
	// (RTS, 0-7).
	RetryCount int
	// RNRRetry is how often a SEND hitting an empty receive queue is
	// retried before RNR_RETRY_EXC_ERR (RTS, 0-7, 7 means forever).
	RNRRetry int
}
