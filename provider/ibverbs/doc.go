// Package ibverbs is krcore's provider for real RDMA NICs: a thin cgo
// binding to rdma-core's libibverbs behind the build tag rdma.
//
// Built with -tags rdma on Linux with cgo and libibverbs-dev, it drives any
// device libibverbs drives (mlx5, rxe soft-RoCE, ...) through the
// provider-neutral verbs API: devices, PDs, MRs over off-heap memory, CQs
// (polled, or awaited through a completion channel on the Go netpoller),
// RC/UC/UD QPs and their state machine, SRQs and address handles. DCI/DCT
// need mlx5dv and are not implemented: such devices report DCSupported
// false and CreateQP(DCI/DCT) fails with verbs.ErrUnsupported.
//
// Built without the tag, the package compiles with no C library and every
// entry point fails with an error wrapping verbs.ErrUnsupported, so
// `go build ./...` works anywhere.
//
// # What the binding adds to libibverbs
//
// Hardware leaves some behaviour to the driver; krcore relies on it being
// the same on every provider, so this package enforces it in Go before a
// work request reaches the device:
//
//   - post-time checks: QP state, opcode for the transport, SGE count,
//     inline size, atomic SGE shape, and queue depth, all answered with the
//     verbs sentinel errors instead of a bare errno;
//   - send-queue accounting as on mlx5: a slot is held until a completion
//     of its WR, or of a later signaled WR, is polled, so MaxSendWR
//     unsignaled WRs fill the queue on every device (rxe frees slots
//     earlier on its own);
//   - work-request IDs: the device sees an internal ID that names the queue
//     slot, and Poll hands back the caller's ID, so completions of stale
//     incarnations (a QP reset and reused) are recognised.
//
// C never holds a Go pointer: registered memory comes from package offheap,
// and work requests are copied into per-QP C arrays and posted in batches of
// up to postBatch per cgo call.
//
// # GID selection
//
// On RoCE the port's GID table holds one entry per address and RoCE
// version. Unless Provider.FixedGID is set, Open picks a RoCE v2 GID that is
// an IPv4-mapped address (routable, what rdma_cm would pick for an IPv4
// peer), else any RoCE v2 GID, else the first non-zero GID. The environment
// variable KRCORE_IBV_GID_INDEX overrides the choice.
package ibverbs

// providerName is what Provider.Name reports.
const providerName = "ibverbs"

// Provider opens libibverbs devices. The zero value is ready to use: port 1
// and an automatically chosen GID.
type Provider struct {
	// Port is the device port to use (1-based); 0 means 1.
	Port int
	// FixedGID makes Open use GIDIndex instead of choosing a GID.
	FixedGID bool
	// GIDIndex is the GID table index used when FixedGID is set.
	GIDIndex int
}

// Name reports "ibverbs".
func (*Provider) Name() string { return providerName }
