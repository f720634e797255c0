package core

import (
	"context"
	"fmt"

	"github.com/krcore/krcore/verbs"
)

// API is the runtime as an application sees it, whether the runtime is
// embedded in the process (Embed) or runs in krcored and is reached through
// package client. Code written against API and VQ runs unchanged on both.
type API interface {
	// Node is the id of the node the runtime serves.
	Node() NodeID
	// Queue makes a virtual queue.
	Queue() (VQ, error)
	// RegMR allocates and registers size bytes of off-heap memory.
	RegMR(size int, access verbs.Access) (*MR, error)
	// Register registers caller-owned off-heap memory (package offheap; a
	// daemon client needs offheap.AllocShared memory).
	Register(buf []byte, access verbs.Access) (*MR, error)
	// Deregister releases an MR from RegMR or Register: refused to new
	// requests at once, released once the requests already using it
	// finish (see Runtime.Deregister).
	Deregister(m *MR) error
	// Export offers n bytes at offset off of mr to every node under name,
	// as a registration of exactly those bytes with exactly access.
	Export(name string, mr *MR, off, n int, access verbs.Access) error
	// Unexport withdraws and revokes a name this API exported.
	Unexport(name string) error
	// Region learns the region node exports under name.
	Region(ctx context.Context, node NodeID, name string) (*Region, error)
	// Stats reports the runtime's counters.
	Stats() Stats
	// Close releases the runtime (embedded) or detaches from it (client).
	Close() error
}

// VQ is a virtual queue, as Queue documents it. *Queue implements it.
type VQ interface {
	Connect(ctx context.Context, node NodeID, opts ...ConnectOption) error
	Push(ctx context.Context, wait bool, reqs ...Request) (int, error)
	Pop(out []Completion) int
	PopWait(ctx context.Context, out []Completion) (int, error)
	PushRecv(bufs ...Local) error
	PopMsgs(out []Message) int
	PopMsgsWait(ctx context.Context, out []Message) (int, error)
	Bind(port uint32) error
	Unbind()
	Region(ctx context.Context, name string) (*Region, error)
	Outstanding() int
	Close() error
}

var (
	_ VQ  = (*Queue)(nil)
	_ API = embedded{}
)

// Embed presents rt as an API. The runtime stays the caller's to close
// (through the API's Close or directly).
func Embed(rt *Runtime) API { return embedded{rt} }

// embedded adapts *Runtime to API: Queue returns the interface and Unexport
// reports an error, which a daemon client can meet.
type embedded struct{ rt *Runtime }

func (e embedded) Node() NodeID { return e.rt.Node() }

func (e embedded) Queue() (VQ, error) {
	q, err := e.rt.Queue()
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return q, nil
}

func (e embedded) RegMR(size int, access verbs.Access) (*MR, error) { return e.rt.RegMR(size, access) }

func (e embedded) Register(buf []byte, access verbs.Access) (*MR, error) {
	return e.rt.Register(buf, access)
}

func (e embedded) Deregister(m *MR) error { return e.rt.Deregister(m) }

func (e embedded) Export(name string, mr *MR, off, n int, access verbs.Access) error {
	return e.rt.Export(name, mr, off, n, access)
}

func (e embedded) Unexport(name string) error { e.rt.Unexport(name); return nil }

func (e embedded) Region(ctx context.Context, node NodeID, name string) (*Region, error) {
	return e.rt.Region(ctx, node, name)
}

func (e embedded) Stats() Stats { return e.rt.Stats() }

func (e embedded) Close() error { return e.rt.Close() }

// Handle ties an MR or a Region made by another implementation of API to
// that implementation's state: Owner is the implementation (a client of
// krcored), ID its name for the object there.
type Handle struct {
	Owner any
	ID    uint64
}

// HandleMR makes an MR over buf that another implementation of API
// registered elsewhere (krcored registers a client's memfd in its own
// process); the runtime refuses it in its own requests. For API
// implementations only.
func HandleMR(h Handle, buf []byte, access verbs.Access) *MR {
	return &MR{handle: &h, buf: buf, access: access}
}

// Handle returns the handle of an MR made by HandleMR; ok is false for the
// runtime's own MRs.
func (m *MR) Handle() (h Handle, ok bool) {
	if m.handle == nil {
		return Handle{}, false
	}
	return *m.handle, true
}

// Access is the access the MR was registered with.
func (m *MR) Access() verbs.Access { return m.access }

// HandleRegion makes a Region that another implementation of API learned
// (krcored keeps the rkey and its own record of the grant, which its
// requests are checked against): node, name, n and access are what that
// implementation reports of it. The runtime refuses it in its own
// requests. For API implementations only.
func HandleRegion(h Handle, node NodeID, name string, n uint64, access verbs.Access) *Region {
	return &Region{g: &grant{node: node, name: name, len: n, access: access}, handle: &h}
}

// Handle returns the handle of a Region made by HandleRegion; ok is false
// for regions the runtime learned itself.
func (g *Region) Handle() (h Handle, ok bool) {
	if g.handle == nil {
		return Handle{}, false
	}
	return *g.handle, true
}

// ConnectOptions reports what opts ask of Connect: the port to SEND to,
// if any. For API implementations that forward a Connect.
func ConnectOptions(opts ...ConnectOption) (port uint32, toPort bool) {
	var q Queue
	for _, o := range opts {
		o(&q)
	}
	return q.dstPort, q.toPort
}

// checkOwner refuses requests naming memory or regions that are not this
// runtime's: an MR of another runtime or of a daemon client carries keys
// the shared QPs must never see; a Region this runtime did not hand out
// (the zero value, another runtime's, a daemon client's) carries no grant
// of this runtime's; and a region learned from another node than the VQ's
// peer is not a grant for the peer. g is the record r's Region holds.
// q.mu held.
func (q *Queue) checkOwner(r *Request, g *grant) *refusal {
	if m := r.Local.MR; m != nil && r.Local.Len != 0 && m.rt != q.rt {
		return &refusal{verbs.LocProtErr, "local MR is not this runtime's"}
	}
	if r.Op.IsSend() || !r.Op.Valid() {
		return nil
	}
	switch {
	case r.Remote.Region == nil:
		return nil // check refuses it
	case g == nil:
		return &refusal{verbs.RemInvReqErr, "a Region the runtime did not hand out (made as a literal or zero value)"}
	case g.rt != q.rt:
		return &refusal{verbs.RemAccessErr, fmt.Sprintf("region %q was not learned by this runtime", g.name)}
	case g.node != q.peer.node:
		return &refusal{verbs.RemAccessErr, fmt.Sprintf("region %q of node %d on a VQ connected to node %d", g.name, g.node, q.peer.node)}
	}
	return nil
}

// ownMR reports whether m is registered with rt.
func (rt *Runtime) ownMR(m *MR) bool { return m != nil && m.rt == rt && m.mr != nil }

// Credits is how many requests each VQ may have outstanding
// (Config.Credits), which a daemon tells its clients.
func (rt *Runtime) Credits() int { return rt.cfg.Credits }

// MaxMessage is the largest two-sided message (Config.MaxMessage).
func (rt *Runtime) MaxMessage() int { return rt.cfg.MaxMessage }

// Exported reports whether a region is exported under name.
func (rt *Runtime) Exported(name string) bool {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	_, ok := rt.exports[name]
	return ok
}
