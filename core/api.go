package core

import (
	"context"
	"fmt"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

var (
	_ krcore.VQ     = (*Queue)(nil)
	_ krcore.API    = embedded{}
	_ krcore.MR     = (*MR)(nil)
	_ krcore.Region = (*Region)(nil)
)

// Embed presents rt as a krcore.API. The runtime stays the caller's to
// close (through the API's Close or directly).
func Embed(rt *Runtime) krcore.API { return embedded{rt} }

// embedded adapts *Runtime to krcore.API: the interface types in place of
// the runtime's concrete ones.
type embedded struct{ rt *Runtime }

func (e embedded) Node() krcore.NodeID { return e.rt.Node() }

func (e embedded) Queue() (krcore.VQ, error) {
	q, err := e.rt.Queue()
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return q, nil
}

func (e embedded) RegMR(size int, access verbs.Access) (krcore.MR, error) {
	m, err := e.rt.RegMR(size, access)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (e embedded) Register(buf []byte, access verbs.Access) (krcore.MR, error) {
	m, err := e.rt.Register(buf, access)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (e embedded) Deregister(m krcore.MR) error { return e.rt.Deregister(m) }

func (e embedded) Export(name string, mr krcore.MR, off, n int, access verbs.Access, to ...krcore.Principal) error {
	return e.rt.Export(name, mr, off, n, access, to...)
}

func (e embedded) Unexport(name string) error { return e.rt.Unexport(name) }

func (e embedded) Region(ctx context.Context, node krcore.NodeID, name string) (krcore.Region, error) {
	g, err := e.rt.Region(ctx, node, name)
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (e embedded) Stats() krcore.Stats { return e.rt.Stats() }

func (e embedded) Close() error { return e.rt.Close() }

// Access is the access the MR was registered with.
func (m *MR) Access() verbs.Access { return m.access }

// checkOwner refuses requests naming memory or regions that are not this
// runtime's: an MR of another runtime or of a daemon client carries keys
// the shared QPs must never see; a Region this runtime did not hand out
// (the zero value, another runtime's, a daemon client's) carries no grant
// of this runtime's; and a region learned from another node than the VQ's
// peer is not a grant for the peer. m is r's local MR if it is this
// runtime's, g the record r's Region holds.
// q.mu held.
func (q *Queue) checkOwner(r *krcore.Request, m *MR, g *grant) *refusal {
	if r.Local.MR != nil && r.Local.Len != 0 && m == nil {
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

// ownMR is the MR behind handle h if rt registered it, else nil: a handle
// of another runtime, of a daemon client or of the caller's own making
// carries keys the shared QPs must never see.
func (rt *Runtime) ownMR(h krcore.MR) *MR {
	m, ok := h.(*MR)
	if !ok || m == nil || m.rt != rt || m.mr == nil {
		return nil
	}
	return m
}

// grantOf is the runtime's record behind a Region handle, or nil for one
// no runtime handed out (the caller's own implementation, a nil or zero
// one). Whose record it is, checkOwner decides.
func grantOf(h krcore.Region) *grant {
	g, ok := h.(*Region)
	if !ok || g == nil {
		return nil
	}
	return g.g
}

// mrOf is the MR behind a local range the runtime has already checked
// (a posted receive buffer, an accepted request).
func mrOf(l krcore.Local) *MR { return l.MR.(*MR) }

// Config is the configuration the runtime runs with, defaults filled in
// (a daemon tells its clients the credits and message size from it).
func (rt *Runtime) Config() Config { return rt.cfg }
