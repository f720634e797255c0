package lite

import (
	"fmt"

	"github.com/krcore/krcore"
)

// layout says where an LMR's bytes live: size bytes cut into stripes of
// stripe bytes, dealt round-robin over nodes, each node holding its
// stripes back to back in one piece of memory. gen counts the layouts the
// LMR had: a Move makes a new one.
type layout struct {
	gen    uint32
	size   int
	stripe int
	nodes  []krcore.NodeID
}

// single is the layout of size bytes held whole by node.
func single(node krcore.NodeID, size int) layout {
	return layout{size: size, stripe: size, nodes: []krcore.NodeID{node}}
}

// locate maps offset off of the LMR to the index of the node holding it,
// the offset in that node's piece, and the bytes left in its stripe.
func (l layout) locate(off int) (node, at, left int) {
	s := off / l.stripe
	k := len(l.nodes)
	return s % k, s/k*l.stripe + off%l.stripe, l.stripe - off%l.stripe
}

// extent is the part of an operation on an LMR one request serves: n
// bytes at offset at of the operation's buffer, at remote in the piece of
// the node with index node in the layout.
type extent struct {
	node   int
	remote uint64
	at, n  int
}

// extents cuts size bytes at offset off of the LMR at stripe boundaries
// and into extents of at most max bytes.
func (l layout) extents(off, size, max int) []extent {
	var out []extent
	for at := 0; at < size; {
		node, remote, left := l.locate(off + at)
		k := min(size-at, left, max)
		out = append(out, extent{node: node, remote: uint64(remote), at: at, n: k})
		at += k
	}
	return out
}

// fits checks that size bytes at offset off lie inside the LMR.
func (l layout) fits(off, size int) error {
	if off < 0 || size < 0 || off > l.size || size > l.size-off {
		return fmt.Errorf("%d bytes at %d of %d: %w", size, off, l.size, krcore.ErrInvalid)
	}
	return nil
}
