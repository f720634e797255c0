package client

import (
	"fmt"
	"sync/atomic"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// mr is an MR the daemon registered for this client: the daemon's id for
// it and the client's mapping of the same memfd pages. The id means
// something only on this client's connection, so a handle another process
// or client presents names nothing there.
type mr struct {
	c      *Client
	id     uint64
	buf    []byte
	access verbs.Access
	gone   atomic.Bool // deregistered: the memory may be unmapped
}

var (
	_ krcore.MR        = (*mr)(nil)
	_ krcore.Forgetter = (*region)(nil)
)

// Bytes is the registered memory, or nil once Deregister released it.
func (m *mr) Bytes() []byte {
	if m.gone.Load() {
		return nil
	}
	return m.buf
}

// Len is the length of the registered memory.
func (m *mr) Len() int { return len(m.buf) }

// Access is the access it was registered with.
func (m *mr) Access() verbs.Access { return m.access }

// Range names n bytes at offset off, for a request.
func (m *mr) Range(off, n int) krcore.Local { return krcore.Local{MR: m, Off: off, Len: n} }

// region is a region the daemon learned for this client: the daemon keeps
// the rkey and its record of the grant, which it checks requests against;
// the client holds the daemon's id and what the daemon reported of it.
type region struct {
	c      *Client
	id     uint64
	node   krcore.NodeID
	name   string
	len    uint64
	access verbs.Access
	gone   atomic.Bool // forgotten: requests naming it are refused
}

// Forget drops the daemon's entry for the region (krcore.Forgetter), which
// otherwise stays until the client detaches; requests naming the region
// afterwards are refused here, before they reach the daemon. It does not
// wait for the daemon's answer, so it may be called under a caller's
// lock. A daemon without wire.FeatureForget keeps the entry. A second
// Forget does nothing.
func (g *region) Forget() error {
	if g.gone.Swap(true) || g.c.features&wire.FeatureForget == 0 {
		return nil
	}
	if err := g.c.post(wire.NewMsg(wire.OpForget, 0).U64(g.id)); err != nil {
		return fmt.Errorf("client: forget region %q of node %d: %w", g.name, g.node, err)
	}
	return nil
}

// Node is the node that exports the region.
func (g *region) Node() krcore.NodeID { return g.node }

// Name is the name the region is exported under.
func (g *region) Name() string { return g.name }

// Len is the region's length in bytes.
func (g *region) Len() uint64 { return g.len }

// Access is the remote access the exporter granted.
func (g *region) Access() verbs.Access { return g.access }

// At names offset off of the region, for a request.
func (g *region) At(off uint64) krcore.Remote { return krcore.Remote{Region: g, Off: off} }

// mrID is the daemon's id of an MR of this client, or 0 (which the daemon
// refuses) for any other MR.
func (c *Client) mrID(h krcore.MR) uint64 {
	if m, ok := h.(*mr); ok && m != nil && m.c == c {
		return m.id
	}
	return 0
}

// MRID is the daemon's name for m, an MR of this client, as the C API and
// krctl name MRs; ok is false for any other MR. The id is no capability:
// the daemon honours it only on the connection that registered it.
func (c *Client) MRID(m krcore.MR) (id uint64, ok bool) {
	id = c.mrID(m)
	return id, id != 0
}

// regionID is the daemon's id of a region this client learned, or 0.
func (c *Client) regionID(h krcore.Region) uint64 {
	if g, ok := h.(*region); ok && g != nil && g.c == c && !g.gone.Load() {
		return g.id
	}
	return 0
}
