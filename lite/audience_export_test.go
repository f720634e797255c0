package lite

import (
	"context"

	"github.com/krcore/krcore"
)

// GrantExports are the names the pieces of l export its live grants
// (Maps and Memcpy's loans) under, read out of its master's state: what a
// process that read the master's memory would learn. It reads between
// changes (op held): a withdrawal drops its grants from the state before
// its pieces unexport them, so a read in between would list none while
// they are still exported.
func GrantExports(l *LMR) []string {
	l.op.Lock()
	defer l.op.Unlock()
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	var out []string
	for exp := range l.live {
		out = append(out, exportName(exp, l.lay.gen))
	}
	return out
}

// RegionAs looks name up at node as n's principal, as n's own lookups do.
func RegionAs(ctx context.Context, n *Node, node krcore.NodeID, name string) (krcore.Region, error) {
	return n.region(ctx, node, name)
}
