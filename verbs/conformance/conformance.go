package conformance

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

// Factory opens two devices that can reach each other: two soft nodes on
// one fabric, a local device and one proxied from another process, or rxe0
// twice. Run calls it once per test and closes both devices when the test
// ends, so a Factory need not close them; if it does, the second Close must
// be harmless (nil or ErrClosed).
type Factory func(t testing.TB) (a, b verbs.Device)

// Capability names accepted in Options.Skip.
const (
	// CapDC: DCI/DCT transport. Also skipped when DeviceAttr.DCSupported
	// is false on either device.
	CapDC = "dc"
	// CapSRQ: shared receive queues. Also skipped when
	// DeviceAttr.SRQSupported is false.
	CapSRQ = "srq"
	// CapAtomic: 8-byte CAS and FAA. Also skipped when DeviceAttr.AtomicCap
	// is false.
	CapAtomic = "atomic"
	// CapInline: inline sends. Also skipped when DeviceAttr.MaxInline is 0.
	CapInline = "inline"
	// CapUD: unreliable datagram QPs.
	CapUD = "ud"
	// CapUC: unreliable connected QPs.
	CapUC = "uc"
	// CapLinkKill: breaking the link between the devices. Also skipped when
	// Options.KillLink is nil.
	CapLinkKill = "link-kill"
	// CapRetry: failing a request whose peer QP does not exist with
	// RETRY_EXC_ERR (needs a bounded Options.RetryTimeout).
	CapRetry = "retry"
	// CapRandomKeys: unpredictable MR keys (a consecutive-index key
	// scheme, as mlx5 has, fails this check).
	CapRandomKeys = "random-keys"
	// CapCQOverrun: reporting a CQ overrun with ErrCQOverrun.
	CapCQOverrun = "cq-overrun"
	// CapHoldResponses: keeping a device's responses back to hold its
	// requests in flight. Also skipped when Options.HoldResponses is nil.
	CapHoldResponses = "hold-responses"
)

var knownCaps = []string{CapDC, CapSRQ, CapAtomic, CapInline, CapUD, CapUC, CapLinkKill, CapRetry, CapRandomKeys, CapCQOverrun, CapHoldResponses}

// Options tune the suite to a provider.
type Options struct {
	// RetryTimeout is the longest a provider takes to fail a request whose
	// peer never answers (RETRY_EXC_ERR) with its default timeout and
	// retry count. Tests that wait for it use a deadline of a few times
	// this. 0 means 2 s.
	RetryTimeout time.Duration
	// Timeout bounds every wait for a completion that should arrive
	// promptly. 0 means 5 s.
	Timeout time.Duration
	// Skip lists capability names (the Cap constants) the provider lacks.
	// Every test needing one calls t.Skip with the reason: nothing passes
	// silently. An unknown name fails Run, so a typo cannot hide a test.
	Skip []string
	// KillLink, if set, breaks the fabric link between a and b for good
	// (soft provider: close the TCP link or the node's wire), so the suite
	// can check that outstanding work fails with RETRY_EXC_ERR instead of
	// hanging. nil skips those tests.
	KillLink func(a, b verbs.Device) error
	// HoldResponses, if set, makes device a keep back every response that
	// arrives for its QPs (a slow network or responder), so the suite can
	// hold requests in flight across a local error or a QP reset. held
	// reports how many responses it holds; release hands them to the QPs
	// in arrival order and stops holding. Tests that need it are skipped
	// when it is nil; the others that use it when set still run without.
	HoldResponses func(a verbs.Device) (held func() int, release func())
}

func (o Options) retryTimeout() time.Duration {
	if o.RetryTimeout > 0 {
		return o.RetryTimeout
	}
	return 2 * time.Second
}

// retryDeadline is how long a test waits for a RETRY_EXC_ERR: a few
// RetryTimeouts, with a floor so a loaded 2-core machine under -race does
// not turn a slow scheduler into a failure.
func (o Options) retryDeadline() time.Duration {
	return max(4*o.retryTimeout(), time.Second)
}

func (o Options) timeout() time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	return 5 * time.Second
}

// testCase is one behaviour: it runs on a fresh pair of devices.
type testCase struct {
	name  string
	needs []string
	run   func(t *testing.T, e *env)
}

// group is a set of related behaviours, run as one t.Run level.
type group struct {
	name  string
	tests []testCase
}

// groups lists every behaviour the suite checks.
func groups() []group {
	return []group{
		{"Device", deviceTests()},
		{"QPState", qpStateTests()},
		{"Post", postTests()},
		{"RC", rcTests()},
		{"Order", orderTests()},
		{"RemoteError", remoteErrorTests()},
		{"LocalError", localErrorTests()},
		{"InFlight", inFlightTests()},
		{"RNR", rnrTests()},
		{"UD", udTests()},
		{"DC", dcTests()},
		{"SRQ", srqTests()},
		{"OneSided", oneSidedTests()},
		{"CQ", cqTests()},
		{"Link", linkTests()},
	}
}

// Run checks that the devices f opens behave like an RNIC driven through
// libibverbs. It calls t.Run per group and per behaviour; each behaviour
// gets a fresh pair from f.
func Run(t *testing.T, f Factory, o Options) {
	for _, c := range o.Skip {
		if !slices.Contains(knownCaps, c) {
			t.Fatalf("conformance: unknown capability %q in Options.Skip (known: %s)", c, strings.Join(knownCaps, ", "))
		}
	}
	for _, g := range groups() {
		t.Run(g.name, func(t *testing.T) {
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) { runCase(t, f, o, tc) })
			}
		})
	}
}

func runCase(t *testing.T, f Factory, o Options, tc testCase) {
	for _, c := range tc.needs {
		if slices.Contains(o.Skip, c) {
			t.Skipf("provider lacks capability %q (Options.Skip)", c)
		}
		if c == CapLinkKill && o.KillLink == nil {
			t.Skip("Options.KillLink is nil: cannot break the link")
		}
		if c == CapHoldResponses && o.HoldResponses == nil {
			t.Skip("Options.HoldResponses is nil: cannot hold responses back")
		}
	}
	e := newEnv(t, f, o)
	for _, c := range tc.needs {
		if why := e.lacks(c); why != "" {
			t.Skip(why)
		}
	}
	tc.run(t, e)
}

// lacks returns why the device pair cannot run tests needing capability c,
// or "" if it can, judged by the devices' attributes.
func (e *env) lacks(c string) string {
	aa, ba := e.a.dev.Attr(), e.b.dev.Attr()
	switch c {
	case CapDC:
		if !aa.DCSupported || !ba.DCSupported {
			return "device lacks DC (DeviceAttr.DCSupported is false)"
		}
	case CapSRQ:
		if !aa.SRQSupported || !ba.SRQSupported {
			return "device lacks SRQ (DeviceAttr.SRQSupported is false)"
		}
	case CapAtomic:
		if !aa.AtomicCap || !ba.AtomicCap {
			return "device lacks atomics (DeviceAttr.AtomicCap is false)"
		}
	case CapInline:
		if aa.MaxInline <= 0 {
			return "device has no inline data (DeviceAttr.MaxInline is 0)"
		}
	}
	return ""
}

// errIs reports a call that should have failed with want.
func errIs(t testing.TB, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %v", what, err, want)
	}
}

// describe formats completions for failure messages.
func describe(wcs []verbs.WC) string {
	var b strings.Builder
	const most = 8
	for i, wc := range wcs {
		if i == most {
			fmt.Fprintf(&b, ", ... %d more", len(wcs)-most)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "{id %d %s %s qpn %d len %d}", wc.ID, wc.Status, wc.Op, wc.QPN, wc.ByteLen)
	}
	return "[" + b.String() + "]"
}
