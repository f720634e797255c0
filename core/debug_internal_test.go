package core

import (
	"context"
	"fmt"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

func (q *Queue) debugState() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	h := entry{}
	if q.n > 0 {
		h = q.ents[q.head]
	}
	return fmt.Sprintf("n=%d credits=%d inflight=%d held=%d route=%p head=%+v", q.n, q.credits, q.inflight, len(q.held), q.route, h)
}

// DebugState exposes a queue's internals to tests.
func DebugState(q *Queue) string { return q.debugState() }

// DebugPQP describes rt's DCIs (their addresses are DebugState's routes).
func DebugPQP(rt *Runtime) string {
	s := ""
	for _, p := range rt.dcis {
		p.mu.Lock()
		s += fmt.Sprintf("dci %p n=%d backlog=%d broken=%v dead=%v base=%d next=%d; ", p, p.n, len(p.backlog), p.broken, p.dead, p.base, p.next)
		p.mu.Unlock()
	}
	return s
}

// Forge returns a Region whose record is g's with its bounds moved and its
// rights widened, as code that edits the record through unsafe would make
// it: the requester's checks pass it, so only the exporter's RNIC stands
// between it and memory it was not granted. rkeyOf, if not nil, lends its
// rkey.
func Forge(h krcore.Region, grow uint64, shift int64, add verbs.Access, rkeyOf krcore.Region) *Region {
	f := *grantOf(h)
	f.len += grow
	f.addr = uint64(int64(f.addr) + shift)
	f.access |= add
	if rkeyOf != nil {
		f.rkey = grantOf(rkeyOf).rkey
	}
	return &Region{g: &f}
}

// MRUses is how many requests and receive buffers hold m.
func MRUses(h krcore.MR) int64 { return h.(*MR).uses.Load() }

// PushRaw pushes r, a WRITE_WITH_IMM on a queue connected to a port, as
// one verbs WRITE_WITH_IMM without its notification: what a writer that
// is not a krcore runtime posts. It waits for a credit within ctx.
func PushRaw(ctx context.Context, q *Queue, r krcore.Request) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if err := q.routeLocked(ctx); err != nil {
		return err
	}
	for q.full() {
		if err := q.waitCredit(ctx); err != nil {
			return err
		}
	}
	var x rec
	if q.accept(&r, &x) {
		x.notify = false
		q.postLocked([]rec{x})
	}
	return nil
}

// Exported reports whether rt exports a region under name.
func Exported(rt *Runtime, name string) bool {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	_, ok := rt.exports[name]
	return ok
}
