// Package conformance is the test suite every verbs provider must pass.
//
// It pins down the behaviour krcore relies on, as real RNICs driven through
// libibverbs show it: the QP state machine; post-time checks (QP state,
// queue depth, SGE count, inline size, opcode per transport); RC data
// movement (WRITE, READ, SEND, the immediates, CAS and FAA, gather/scatter,
// inline, unsignaled WRs), in order and exactly once, also under concurrent
// posters; remote and local protection faults, which complete the failing
// WR with REM_ACCESS_ERR, REM_INV_REQ_ERR or LOC_PROT_ERR, move the QP to ERR
// and flush everything behind it without touching target memory; receiver
// not ready; UD datagrams (GRH, MTU, Q_Key); DC targets and keys; SRQs; CQ
// waits and overrun; and the RETRY_EXC_ERR a dead link or missing peer QP
// ends in, within a bounded time.
//
// A provider runs it from its own test with a Factory that opens two
// devices able to reach each other (verbs/conformance/soft_test.go is the
// in-process run on the soft provider):
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, func(t testing.TB) (verbs.Device, verbs.Device) {
//			fab := soft.NewFabric()
//			return node(t, fab), node(t, fab)
//		}, conformance.Options{
//			RetryTimeout: 200 * time.Millisecond,
//			// Stopping b's RNIC is a link that never comes back.
//			KillLink: func(a, b verbs.Device) error { return b.Close() },
//		})
//	}
//
// Every behaviour runs as its own subtest (Run/Group/Behaviour) on a fresh
// pair, so one broken behaviour cannot mask another and -run selects a
// single check. The suite closes both devices when each subtest ends.
//
// All memory comes from offheap.AllocShared (memfd), so a provider that
// proxies device b into another process can map the very pages the suite
// checks. Remote addresses are always taken from MR.Addr, never from this
// process's view of a slice. Device a must live in the test's process: the
// inline test hands it an unregistered buffer by this process's address.
//
// # Capabilities
//
// A provider that lacks a feature names it in Options.Skip with the Cap
// constants ("dc", "srq", "atomic", "inline", "ud", "uc", "link-kill",
// "retry", "random-keys", "cq-overrun"). The suite also reads each device's
// DeviceAttr (DCSupported, SRQSupported, AtomicCap, MaxInline) and skips
// what a device reports it cannot do. Either way the test calls t.Skip
// with the reason, so a missing feature is visible in -v output and never
// passes silently. Link-death tests also need Options.KillLink.
//
// Waits never hang: completions are polled briefly and then awaited with
// CQ.Wait under a deadline (Options.Timeout, or a few Options.RetryTimeout
// for tests that wait for a retry to be exhausted).
package conformance
