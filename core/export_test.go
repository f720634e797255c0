package core

// SendSleeps is how many times rt's waiters for its queues' completions
// slept on the completion queue (CQ.Wait), for the tests of package
// core_test.
func SendSleeps(rt *Runtime) uint64 { return rt.sends.sleeps.Load() }
