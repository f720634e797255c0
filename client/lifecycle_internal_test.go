package client

import (
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon/wire"
)

// DebugCompleted is how many completions wait on q's completion ring,
// unpopped: tests wait for one without popping it.
func DebugCompleted(q core.VQ) int {
	v := q.(*VQ)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return len(v.left)
	}
	return int(v.ring.Ctr(wire.CQTail).Load() - v.cqHead)
}
