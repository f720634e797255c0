package conformance_test

import (
	"testing"
	"time"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
	"github.com/krcore/krcore/verbs/conformance"
)

// retryTimeout is the soft nodes' retry budget. Every request of the suite
// runs under it, not only the link-death tests that wait for it, so it must
// outlast a stall of a loaded 2-core machine under -race: at 200 ms 29 of 75
// runs of the three suites failed a request with RETRY_EXC_ERR at load
// 23-30, at 1 s 3 of 75 (a request unanswered for 1 s in a 1.4 s test).
const retryTimeout = 2 * time.Second

// killNode breaks the link for good by stopping b's RNIC: a then hears
// nothing from it, as when a cable or host dies. (Node.BreakLinks would
// let later requests dial a new TCP link.)
func killNode(_, b verbs.Device) error { return b.Close() }

// holdResponses holds back the responses that reach soft node a.
func holdResponses(a verbs.Device) (func() int, func()) { return a.(*soft.Node).HoldResponses() }

// TestSoftMem runs the suite on two soft nodes joined by the in-memory
// wire.
func TestSoftMem(t *testing.T) {
	conformance.Run(t, func(t testing.TB) (verbs.Device, verbs.Device) {
		fab := soft.NewFabric()
		return newNode(t, fab, soft.Config{}), newNode(t, fab, soft.Config{})
	}, conformance.Options{RetryTimeout: retryTimeout, KillLink: killNode, HoldResponses: holdResponses})
}

// TestSoftTCP runs the suite on two soft nodes that reach each other only
// over TCP on loopback, as nodes on two hosts do.
func TestSoftTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("TCP run skipped in -short mode")
	}
	conformance.Run(t, func(t testing.TB) (verbs.Device, verbs.Device) {
		cfg := soft.Config{Listen: "127.0.0.1:0", TCPOnly: true}
		return newNode(t, nil, cfg), newNode(t, nil, cfg)
	}, conformance.Options{RetryTimeout: retryTimeout, KillLink: killNode, HoldResponses: holdResponses})
}

// TestSoftShm runs the suite on two soft nodes on no common fabric that
// listen on TCP, as nodes in two processes of one host do: they reach each
// other over the shared-memory link.
func TestSoftShm(t *testing.T) {
	conformance.Run(t, func(t testing.TB) (verbs.Device, verbs.Device) {
		cfg := soft.Config{Listen: "127.0.0.1:0"}
		a, b := newNode(t, nil, cfg), newNode(t, nil, cfg)
		t.Cleanup(func() {
			if kind, why := a.PeerLink(b.Addr()); kind != "shm" && kind != "" || why != nil {
				t.Errorf("a reached b over %q (shm refused: %v), want shm", kind, why)
			}
		})
		return a, b
	}, conformance.Options{RetryTimeout: retryTimeout, KillLink: killNode, HoldResponses: holdResponses})
}

// dialTimeout bounds a link's setup (a TCP connect, the shared-memory
// link's hello). It defaults to the retry timeout, and under -race at load
// 10-14 a hello took longer than retryTimeout: the requests waiting for
// the link failed with RETRY_EXC_ERR, no test's subject. A link to a
// closed node (killNode) is refused at once whatever this is.
const dialTimeout = 5 * time.Second

// newNode starts a soft node on fab, or on no fabric (TCP only) if nil.
func newNode(t testing.TB, fab *soft.Fabric, cfg soft.Config) *soft.Node {
	t.Helper()
	cfg.RetryTimeout = retryTimeout
	cfg.DialTimeout = dialTimeout
	var (
		n   *soft.Node
		err error
	)
	if fab != nil {
		n, err = fab.NewNode(cfg)
	} else {
		n, err = soft.NewNode(cfg)
	}
	if err != nil {
		t.Fatalf("soft node: %v", err)
	}
	return n
}
