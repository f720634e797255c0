package krcore

import (
	"context"

	"github.com/krcore/krcore/verbs"
)

// API is the runtime as an application sees it, whether embedded in the
// process (core.Embed) or running in krcored (client.Attach).
type API interface {
	// Node is the id of the node the runtime serves.
	Node() NodeID
	// Queue makes a virtual queue.
	Queue() (VQ, error)
	// RegMR allocates and registers size bytes of off-heap memory.
	RegMR(size int, access verbs.Access) (MR, error)
	// Register registers caller-owned off-heap memory (package offheap; a
	// client of krcored needs offheap.AllocShared memory, which the daemon
	// can map).
	Register(buf []byte, access verbs.Access) (MR, error)
	// Deregister releases an MR this API made: refused to new requests at
	// once, released once the requests already using it finish (or, past a
	// bound, by the last of them, with an error wrapping ErrBusy).
	Deregister(m MR) error
	// Export offers n bytes at offset off of mr under name, as a
	// registration of exactly those bytes with exactly access: to every
	// node and process, or, given to, only to those principals (its
	// audience). A lookup by anyone else is answered as for a name not
	// exported (ErrNoRegion). A principal with node or port 0, or a
	// reserved port, is ErrInvalid; more than MaxAudience is ErrLimit.
	Export(name string, mr MR, off, n int, access verbs.Access, to ...Principal) error
	// Unexport withdraws and revokes a name this API exported.
	Unexport(name string) error
	// Region learns the region node exports under name. It asks as no
	// port: a region exported to an audience is refused (ErrNoRegion); ask
	// with VQ.Region on a bound queue.
	Region(ctx context.Context, node NodeID, name string) (Region, error)
	// Stats reports the runtime's counters.
	Stats() Stats
	// Close releases the runtime (embedded) or detaches from it (client);
	// whatever waits on it fails with ErrClosed.
	Close() error
}

// ConnectOptions says what Connect points a VQ at besides the node. The
// zero value (or nil) connects for one-sided requests only.
type ConnectOptions struct {
	// Port is the port bound at the node (VQ.Bind) that the VQ's SENDs and
	// WRITE_WITH_IMM notifications go to; 0 is none, and they are then
	// refused. Ports with the top bit set are reserved, as for Bind
	// (ErrInvalid).
	Port uint32
}

// Principal is who a region is exported to (API.Export): a node, and a
// port on it that a queue holds bound (VQ.Bind). A node's runtime lets one
// queue hold a port at a time, and krcored lets a client ask only as a
// port its own queue holds, so a principal is one process's endpoint: the
// one a node sees as a message's sender (Message.From and Message.Port).
type Principal struct {
	Node NodeID
	Port uint32
}

// MaxAudience bounds the principals one export names.
const MaxAudience = 64

// VQ is a virtual queue: one private, ordered queue to one node at a time,
// multiplexed by the runtime onto shared QPs.
type VQ interface {
	// Connect points the queue at node. It costs a cached lookup when the
	// node is known and one RDMA READ of the MetaServer when it is not. A
	// queue with requests outstanding cannot move to another node
	// (ErrBusy). opts may be nil.
	Connect(ctx context.Context, node NodeID, opts *ConnectOptions) error
	// Push submits requests in order and returns how many it accepted.
	// With wait, it waits for credit (within ctx) instead of failing with
	// ErrNoCredit. A malformed request is refused before it reaches a
	// shared QP and completes with an error status in its place.
	Push(ctx context.Context, wait bool, reqs ...Request) (int, error)
	// PushOne is Push of one request: accepted when err is nil. Called
	// through this interface, Push(ctx, wait, req) builds its variadic
	// slice on the heap per call (the compiler cannot see that no
	// implementation keeps it); PushOne takes the request by value and
	// allocates nothing, so a loop of single requests calls PushOne.
	PushOne(ctx context.Context, wait bool, req Request) error
	// Pop copies finished completions into out, in push order, without
	// blocking, and returns how many.
	Pop(out []Completion) int
	// PopWait is Pop that waits, within ctx, for at least one.
	PopWait(ctx context.Context, out []Completion) (int, error)
	// PushRecv posts buffers that messages to the bound port land in.
	PushRecv(bufs ...Local) error
	// PopMsgs copies received messages into out, in arrival order.
	PopMsgs(out []Message) int
	// PopMsgsWait is PopMsgs that waits, within ctx, for at least one.
	PopMsgsWait(ctx context.Context, out []Message) (int, error)
	// PopAnyWait waits, within ctx, until the queue has a completion for
	// out or a message for msgs, and pops what is ready of both: nc
	// completions into out, nm messages into msgs. One goroutine sleeps
	// once for either, so a caller that pushed a request and expects the
	// answer at the port its queue holds takes both itself. An empty
	// msgs makes it PopWait, an empty out PopMsgsWait; both empty is
	// ErrInvalid. Close wakes it with ErrClosed once nothing is left.
	PopAnyWait(ctx context.Context, out []Completion, msgs []Message) (nc, nm int, err error)
	// Bind takes a port on this node: SENDs to it arrive at this queue.
	// Port 0 is reserved; a port another queue holds fails with
	// ErrPortInUse.
	Bind(port uint32) error
	// Unbind gives the port back.
	Unbind()
	// Region learns the region the connected node exports under name,
	// asking as this node and the port the queue is bound to (none when
	// unbound), which its runtime vouches for because the queue holds it:
	// a region exported to an audience is found only by a principal in it.
	Region(ctx context.Context, name string) (Region, error)
	// Outstanding is the number of requests pushed and not yet popped.
	Outstanding() int
	// Close fails what waits on the queue with ErrClosed and releases it.
	Close() error
}
