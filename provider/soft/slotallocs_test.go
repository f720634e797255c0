//go:build !race

// The race detector allocates on its own account: allocation counts hold
// without it.

package soft_test

import (
	"testing"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestFirstPassAllocs: a new QP's first pass through its send and receive
// queue slots allocates nothing. Each slot's SGE storage used to be made
// at the slot's first use, so a VQ moved to a DCI or RC QP it had not used
// allocated once a request until that QP's queue had wrapped (core's
// TestPushOneAllocs and TestSleepingPopWaitAllocs failed under load, when
// requests spread over more of the pool's QPs).
func TestFirstPassAllocs(t *testing.T) {
	fab := soft.NewFabric()
	a, _ := fab.NewNode(soft.Config{})
	b, _ := fab.NewNode(soft.Config{})
	defer a.Close()
	defer b.Close()
	x, y := connectPairPath(t, a, b, 64, patientPath)
	depth := 256 // newSide's MaxSendWR and MaxRecvWR
	send := verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 8)}, Flags: verbs.Signaled}
	recv := []verbs.RecvWR{{SGL: []verbs.SGE{verbs.SGEOf(y.mr, 0, 8)}}}
	sends := []verbs.SendWR{send}
	var wc [1]verbs.WC
	one := func() {
		if _, err := y.qp.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		if _, err := x.qp.PostSend(sends); err != nil {
			t.Fatal(err)
		}
		for _, cq := range []verbs.CQ{x.cq, y.cq} {
			for {
				n, err := cq.Poll(wc[:])
				if err != nil {
					t.Fatal(err)
				}
				if n == 1 {
					break
				}
			}
			if wc[0].Status != verbs.Success {
				t.Fatal(wc[0].Status)
			}
		}
	}
	// AllocsPerRun's own first call is a warm-up: depth-1 runs after it
	// use the slots not yet used.
	if n := testing.AllocsPerRun(depth-1, one); n != 0 {
		t.Errorf("a SEND and its receive in slots not used before allocate %.0f times", n)
	}
}
