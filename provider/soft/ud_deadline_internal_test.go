package soft

import (
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

// TestUDSentNeverTimesOut: a datagram is done once it is on the wire, so
// the retry sweep never fails a UD QP, however long its sender is held
// between writing the datagram and completing it (a process stopped or
// starved there, as a SIGSTOPped node is). When the pump armed the
// response deadline for it, a sweep in that window moved the QP to ERR
// with RETRY_EXC_ERR and flushed its receives: a control QP that only
// answers requests never recovered and never heard from anyone again.
// The test stands where the pump stands after next (datagram taken for
// the wire, q.mu released) and runs the sweep's check an hour later.
func TestUDSentNeverTimesOut(t *testing.T) {
	n, err := NewFabric().NewNode(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	pd, _ := n.AllocPD()
	cq, _ := n.CreateCQ(16)
	var qps [2]*qp
	for i := range qps {
		q, err := pd.CreateQP(verbs.QPInit{Type: verbs.UD, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
		if err != nil {
			t.Fatal(err)
		}
		if err := verbs.Ready(q, verbs.Path{QKey: 7, Timeout: 20 * time.Millisecond, RetryCount: -1}); err != nil {
			t.Fatal(err)
		}
		qps[i] = q.(*qp)
	}
	a, b := qps[0], qps[1]
	ah, err := pd.CreateAH(verbs.AHAttr{Dest: b.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Close()
	a.mu.Lock()
	a.pumping = true // PostSend only queues: the test is the pump
	a.mu.Unlock()
	if _, err := a.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled, AH: ah, RemoteQPN: b.num, QKey: 7}}); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	_, _, ok := a.next(&a.out)
	a.mu.Unlock()
	if !ok {
		t.Fatal("the datagram was not taken for the wire")
	}
	a.expire(a.node.now() + int64(time.Hour))
	if st := a.State(); st != verbs.StateRTS {
		t.Errorf("UD QP is %v after a sweep while its datagram was on the wire, want RTS", st)
	}
	wcs := make([]verbs.WC, 4)
	if k, _ := cq.Poll(wcs); k != 0 {
		t.Errorf("a sweep completed the datagram on the wire: %+v", wcs[:k])
	}
	a.mu.Lock()
	a.out.release()
	a.pumping = false
	a.mu.Unlock()
}
