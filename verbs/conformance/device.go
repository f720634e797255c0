package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

func deviceTests() []testCase {
	return []testCase{
		{name: "Attr", run: testAttr},
		{name: "CreateClose", run: testCreateClose},
		{name: "CreateCloseSRQ", needs: []string{CapSRQ}, run: testCreateCloseSRQ},
		{name: "RegMRHeapMemory", run: testRegMRHeap},
		{name: "RegMRRemoteWriteNeedsLocalWrite", run: testRegMRNeedsLocalWrite},
		{name: "PDBusy", run: testPDBusy},
		{name: "CQBusy", run: testCQBusy},
		{name: "ClosedDevice", run: testClosedDevice},
		{name: "ClosedQP", run: testClosedQP},
		{name: "MRKeys", needs: []string{CapRandomKeys}, run: testMRKeys},
	}
}

// testAttr checks that both devices report limits a caller can size
// queues by, and an active port.
func testAttr(t *testing.T, e *env) {
	for _, n := range []*node{e.a, e.b} {
		if n.dev.Name() == "" {
			t.Errorf("device %s: empty Name", n.name)
		}
		at := n.dev.Attr()
		positive := map[string]int{
			"MaxQP": at.MaxQP, "MaxQPWR": at.MaxQPWR, "MaxSGE": at.MaxSGE, "MaxCQ": at.MaxCQ,
			"MaxCQE": at.MaxCQE, "MaxMR": at.MaxMR, "MaxPD": at.MaxPD,
			"MaxMRSize": int(min(at.MaxMRSize, 1<<40)), "MaxMsgSize": int(at.MaxMsgSize),
		}
		if at.SRQSupported {
			positive["MaxSRQ"], positive["MaxSRQWR"] = at.MaxSRQ, at.MaxSRQWR
		}
		for k, v := range positive {
			if v <= 0 {
				t.Errorf("device %s: %s = %d, want > 0", n.name, k, v)
			}
		}
		if at.MaxInline < 0 {
			t.Errorf("device %s: MaxInline = %d", n.name, at.MaxInline)
		}
		if at.MaxQPWR < 64 || at.MaxCQE < 256 || at.MaxSGE < 1 {
			t.Errorf("device %s: limits %+v too small for any real RNIC (want MaxQPWR >= 64, MaxCQE >= 256)", n.name, at)
		}
		p := n.dev.Port()
		if p.Num < 1 || !p.Active {
			t.Errorf("device %s: port %+v, want Num >= 1 and Active", n.name, p)
		}
		if p.MTU < 256 || p.MTU > 4096 || p.MTU&(p.MTU-1) != 0 {
			t.Errorf("device %s: port MTU %d, want a power of two in [256, 4096]", n.name, p.MTU)
		}
		if p.Addr == "" && p.GID == (verbs.GID{}) && p.LID == 0 {
			t.Errorf("device %s: port has no Addr, GID or LID: peers cannot reach it", n.name)
		}
	}
}

// testCreateClose creates one of each object and closes them children
// first, as an application tears down.
func testCreateClose(t *testing.T, e *env) {
	a := e.a
	pd, err := a.dev.AllocPD()
	if err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	closeLater(t, "PD", pd)
	mem := alloc(t, 8192)
	mr, err := pd.RegMR(mem[4096:], verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatalf("RegMR: %v", err)
	}
	closeLater(t, "MR", mr)
	if mr.Len() != 4096 || mr.Access() != verbs.AccessLocalWrite|verbs.AccessRemoteRead || &mr.Bytes()[0] != &mem[4096] {
		t.Errorf("MR reports len %d access %s, want 4096 and LOCAL_WRITE|REMOTE_READ over the registered bytes", mr.Len(), mr.Access())
	}
	cq, err := a.dev.CreateCQ(100)
	if err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	closeLater(t, "CQ", cq)
	if cq.Cap() < 100 {
		t.Errorf("CQ Cap %d, asked for 100", cq.Cap())
	}
	var qps []verbs.QP
	for _, typ := range []verbs.QPType{verbs.RC, verbs.UD} {
		qp, err := pd.CreateQP(verbs.QPInit{Type: typ, SendCQ: cq, RecvCQ: cq, Cap: a.defaultCap()})
		if err != nil {
			t.Fatalf("CreateQP(%s): %v", typ, err)
		}
		closeLater(t, "QP", qp)
		if qp.Type() != typ || qp.State() != verbs.StateReset || qp.Num() == 0 || qp.Num() > 1<<24-1 {
			t.Errorf("new QP: type %s state %s num %d, want %s RESET and a 24-bit non-zero number", qp.Type(), qp.State(), qp.Num(), typ)
		}
		qps = append(qps, qp)
	}
	if qps[0].Num() == qps[1].Num() {
		t.Errorf("two QPs share number %d", qps[0].Num())
	}
	ah, err := pd.CreateAH(verbs.AHAttr{Dest: e.b.portEndpoint()})
	if err != nil {
		t.Fatalf("CreateAH: %v", err)
	}
	closeLater(t, "AH", ah)
	for _, c := range []interface{ Close() error }{ah, qps[1], qps[0], cq, mr, pd} {
		if err := c.Close(); err != nil {
			t.Errorf("close %T: %v", c, err)
		}
	}
}

// portEndpoint names n's port for an address handle.
func (n *node) portEndpoint() verbs.Endpoint {
	p := n.dev.Port()
	return verbs.Endpoint{Addr: p.Addr, GID: p.GID, LID: p.LID}
}

func testCreateCloseSRQ(t *testing.T, e *env) {
	srq, err := e.a.pd.CreateSRQ(verbs.SRQInit{MaxWR: 16, MaxSGE: 1})
	if err != nil {
		t.Fatalf("CreateSRQ: %v", err)
	}
	closeLater(t, "SRQ", srq)
	cq := e.a.cq(32)
	qp := e.a.qp(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, SRQ: srq})
	errIs(t, "close SRQ used by a QP", srq.Close(), verbs.ErrBusy)
	if err := qp.Close(); err != nil {
		t.Fatalf("close QP: %v", err)
	}
	if err := srq.Close(); err != nil {
		t.Errorf("close SRQ: %v", err)
	}
}

// testRegMRHeap: an RNIC writes registered memory behind the runtime's
// back, so Go heap memory (which moves and is collected) must be refused.
func testRegMRHeap(t *testing.T, e *env) {
	mr, err := e.a.pd.RegMR(make([]byte, 4096), verbs.AccessLocalWrite)
	if err == nil {
		mr.Close()
		t.Fatal("RegMR of Go heap memory succeeded")
	}
	t.Logf("RegMR of heap memory: %v", err)
}

// testRegMRNeedsLocalWrite: as in ibv_reg_mr, remote write or atomic
// access requires local write.
func testRegMRNeedsLocalWrite(t *testing.T, e *env) {
	mem := alloc(t, 4096)
	for _, acc := range []verbs.Access{verbs.AccessRemoteWrite, verbs.AccessRemoteAtomic, verbs.AccessRemoteWrite | verbs.AccessRemoteRead} {
		mr, err := e.a.pd.RegMR(mem, acc)
		if err == nil {
			mr.Close()
		}
		errIs(t, "RegMR with "+acc.String(), err, verbs.ErrInvalid)
	}
}

// testPDBusy: a PD cannot go while MRs or QPs made from it are open.
func testPDBusy(t *testing.T, e *env) {
	pd, err := e.a.dev.AllocPD()
	if err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	closeLater(t, "PD", pd)
	mr, err := pd.RegMR(alloc(t, 4096), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatalf("RegMR: %v", err)
	}
	closeLater(t, "MR", mr)
	cq := e.a.cq(16)
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: e.a.defaultCap()})
	if err != nil {
		t.Fatalf("CreateQP: %v", err)
	}
	closeLater(t, "QP", qp)
	errIs(t, "close PD with a live MR and QP", pd.Close(), verbs.ErrBusy)
	if err := mr.Close(); err != nil {
		t.Fatalf("close MR: %v", err)
	}
	errIs(t, "close PD with a live QP", pd.Close(), verbs.ErrBusy)
	if err := qp.Close(); err != nil {
		t.Fatalf("close QP: %v", err)
	}
	if err := pd.Close(); err != nil {
		t.Errorf("close empty PD: %v", err)
	}
}

// testCQBusy: a CQ cannot go while a QP completes into it.
func testCQBusy(t *testing.T, e *env) {
	cq, err := e.a.dev.CreateCQ(16)
	if err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	closeLater(t, "CQ", cq)
	qp := e.a.qp(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq})
	errIs(t, "close CQ used by a QP", cq.Close(), verbs.ErrBusy)
	if err := qp.Close(); err != nil {
		t.Fatalf("close QP: %v", err)
	}
	if err := cq.Close(); err != nil {
		t.Errorf("close unused CQ: %v", err)
	}
}

// testClosedDevice: closing a device closes everything made from it, and
// every later call reports ErrClosed instead of touching freed state.
func testClosedDevice(t *testing.T, e *env) {
	a := e.a
	cq := a.cq(16)
	qp := a.qp(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq})
	mr := a.mr(4096, verbs.AccessAll)
	spare := alloc(t, 4096)
	if err := a.dev.Close(); err != nil {
		t.Fatalf("close device: %v", err)
	}
	_, err := a.dev.AllocPD()
	errIs(t, "AllocPD", err, verbs.ErrClosed)
	_, err = a.dev.CreateCQ(16)
	errIs(t, "CreateCQ", err, verbs.ErrClosed)
	_, err = a.pd.RegMR(spare, verbs.AccessLocalWrite)
	errIs(t, "RegMR", err, verbs.ErrClosed)
	_, err = a.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	errIs(t, "CreateQP", err, verbs.ErrClosed)
	errIs(t, "Modify", qp.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessAll}), verbs.ErrClosed)
	_, err = qp.PostSend([]verbs.SendWR{writeWR(1, mr.sge(0, 8), mr, 8)})
	errIs(t, "PostSend", err, verbs.ErrClosed)
	_, err = qp.PostRecv([]verbs.RecvWR{recvWR(1, mr.sge(0, 8))})
	errIs(t, "PostRecv", err, verbs.ErrClosed)
	// The CQ may still hand out flushed completions, then must say it is
	// closed rather than look empty forever.
	buf := make([]verbs.WC, 8)
	for range 8 {
		n, err := cq.Poll(buf)
		for _, wc := range buf[:n] {
			wantStatus(t, wc, wc.ID, verbs.WRFlushErr)
		}
		if n == 0 || err != nil {
			errIs(t, "Poll", err, verbs.ErrClosed)
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	errIs(t, "Wait", cq.Wait(ctx), verbs.ErrClosed)
	if err := a.dev.Close(); err != nil && !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("second device Close: %v, want nil or ErrClosed", err)
	}
}

// testClosedQP: a destroyed QP refuses work.
func testClosedQP(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	mr := e.a.mr(64, verbs.AccessAll)
	if err := p.qa.Close(); err != nil {
		t.Fatalf("close QP: %v", err)
	}
	_, err := p.qa.PostSend([]verbs.SendWR{writeWR(1, mr.sge(0, 8), mr, 8)})
	errIs(t, "PostSend on a closed QP", err, verbs.ErrClosed)
	errIs(t, "Modify a closed QP", p.qa.Modify(verbs.QPAttr{State: verbs.StateErr}), verbs.ErrClosed)
}

// testMRKeys: keys must not be guessable. A peer that learns one rkey
// must not be able to reach a neighbouring region by adding a constant,
// which is what KRCore's protection relies on.
func testMRKeys(t *testing.T, e *env) {
	const n, size = 64, 4096
	mem := alloc(t, n*size)
	lkeys, rkeys := map[uint32]bool{}, make([]uint32, 0, n)
	seen := map[uint32]bool{}
	for i := range n {
		mr, err := e.a.pd.RegMR(mem[i*size:(i+1)*size], verbs.AccessAll)
		if err != nil {
			t.Fatalf("RegMR %d: %v", i, err)
		}
		closeLater(t, "MR", mr)
		if lkeys[mr.LKey()] {
			t.Errorf("lkey %#x repeats", mr.LKey())
		}
		if seen[mr.RKey()] {
			t.Errorf("rkey %#x repeats", mr.RKey())
		}
		lkeys[mr.LKey()], seen[mr.RKey()] = true, true
		rkeys = append(rkeys, mr.RKey())
	}
	diffs := map[uint32]int{}
	top := 0
	for i := 1; i < n; i++ {
		d := rkeys[i] - rkeys[i-1]
		diffs[d]++
		top = max(top, diffs[d])
	}
	if len(diffs) == 1 {
		t.Fatalf("rkeys form an arithmetic progression (step %#x): %#x...", rkeys[1]-rkeys[0], rkeys[:4])
	}
	if top > (n-1)/2 {
		t.Errorf("%d of %d consecutive rkeys differ by the same step: keys are predictable", top, n-1)
	}
}
