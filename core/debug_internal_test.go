package core

import "fmt"

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

func DebugPQP(rt *Runtime) string {
	s := ""
	for _, p := range rt.dcis {
		p.mu.Lock()
		s += fmt.Sprintf("dci n=%d backlog=%d broken=%v dead=%v base=%d next=%d; ", p.n, len(p.backlog), p.broken, p.dead, p.base, p.next)
		p.mu.Unlock()
	}
	return s
}
