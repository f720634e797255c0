package core

// DebugDone is how many of q's requests at the head have finished and wait
// to be popped: tests wait for a completion without popping it.
func DebugDone(q *Queue) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := 0
	for k < q.n && q.ents[(q.head+k)%len(q.ents)].done {
		k++
	}
	return k
}
