package client

import (
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon/wire"
)

// StealMR is the handle c would hold had it learned the daemon's id of
// another client's MR m and built a handle around it.
func StealMR(c *Client, m krcore.MR) krcore.MR {
	o := m.(*mr)
	return &mr{c: c, id: o.id, buf: make([]byte, len(o.buf)), access: o.access}
}

// StealRegion is StealMR for a region another client learned.
func StealRegion(c *Client, g krcore.Region) krcore.Region {
	o := g.(*region)
	return &region{c: c, id: o.id, node: o.node, name: o.name, len: o.len, access: o.access}
}

// DebugCompleted is how many completions wait on q's completion ring,
// unpopped: tests wait for one without popping it.
func DebugCompleted(q krcore.VQ) int {
	v := q.(*VQ)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return len(v.left)
	}
	return int(v.ring.Ctr(wire.CQTail).Load() - v.cqHead)
}

// WithoutFeatures makes c speak to its daemon as to one of the first
// protocol, which offers no feature beyond it.
func WithoutFeatures(c *Client) { c.features = 0 }

// SetCallTimeout sets the bound of c's calls that take no context.
func SetCallTimeout(c *Client, d time.Duration) { c.timeout = d }
