package core

// SendSleeps is how many times rt's waiters for its queues' completions
// slept on the completion queue (CQ.Wait), for the tests of package
// core_test.
func SendSleeps(rt *Runtime) uint64 { return rt.sends.sleeps.Load() }

// Credits is how many of q's credits are free, for the tests of package
// core_test.
func Credits(q *Queue) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.credits
}
