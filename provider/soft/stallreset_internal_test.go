package soft

import (
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

// TestStalledPayloadAcrossReset: a SEND whose payload stalls while its QP
// goes to ERR, is reset and connected again, with a receive posted to the
// new incarnation, is lost when its payload ends: it neither lands in the
// new receive nor completes the old one, and is not answered. The new
// incarnation serves a SEND after it.
func TestStalledPayloadAcrossReset(t *testing.T) {
	const size = 4 << 20
	r := newStallRig(t, 2*size)
	q, other := r.rc(t, 5), r.rc(t, 6)
	if _, err := q.PostRecv([]verbs.RecvWR{{ID: 77, SGL: []verbs.SGE{verbs.SGEOf(r.mr, 0, size)}}}); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = 0xAB
	}
	f := frame{typ: frameRequest, op: verbs.OpSend, dstQPN: q.Num(), srcQPN: 5}
	r.send(t, f, payload, size-1)
	time.Sleep(20 * time.Millisecond) // the node reads into the payload
	for _, st := range []verbs.QPState{verbs.StateErr, verbs.StateReset} {
		if err := q.Modify(verbs.QPAttr{State: st}); err != nil {
			t.Fatal(err)
		}
	}
	if err := verbs.Connect(q, verbs.Endpoint{Addr: stallPeer, QPN: 5}, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.PostRecv([]verbs.RecvWR{{ID: 88, SGL: []verbs.SGE{verbs.SGEOf(r.mr, size, size)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.far.Write(payload[size-1:]); err != nil {
		t.Fatal(err)
	}
	read := frame{typ: frameRequest, op: verbs.OpRead, dstQPN: other.Num(), srcQPN: 6, rkey: r.mr.RKey(), raddr: r.mr.Addr(), rlen: 8}
	r.send(t, read, nil, 0)
	for got := range r.frames {
		if got.srcQPN == q.Num() {
			t.Fatalf("the stalled SEND was answered (syndrome %d) after its QP was reset", got.syn)
		}
		if got.srcQPN == other.Num() {
			break
		}
	}
	wc := make([]verbs.WC, 8)
	n, err := r.cq.Poll(wc)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range wc[:n] {
		if w.ID == 88 || w.Status == verbs.Success {
			t.Fatalf("completion %+v: the old incarnation's SEND reached the new one", w)
		}
	}
	if b := r.mr.Bytes()[size]; b != 0 {
		t.Fatalf("the new receive's buffer holds %#x", b)
	}
	// The new incarnation takes a SEND into 88.
	small := []byte("hello")
	f.psn = 0
	r.send(t, f, small, len(small))
	deadline := time.Now().Add(10 * time.Second)
	for n = 0; n == 0 && time.Now().Before(deadline); {
		if n, err = r.cq.Poll(wc); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	if n != 1 || wc[0].ID != 88 || wc[0].Status != verbs.Success || string(r.mr.Bytes()[size:size+5]) != "hello" {
		t.Fatalf("%d completions %+v after a SEND to the new incarnation", n, wc[:n])
	}
}
