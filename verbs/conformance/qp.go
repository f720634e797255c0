package conformance

import (
	"errors"
	"fmt"
	"testing"

	"github.com/krcore/krcore/verbs"
)

func qpStateTests() []testCase {
	return []testCase{
		{name: "Transitions", run: testTransitions},
		{name: "EveryStep", run: testEveryStep},
		{name: "AnyToErr", run: testAnyToErr},
		{name: "ResetAndReconnect", run: testResetReconnect},
	}
}

func postTests() []testCase {
	return []testCase{
		{name: "NotRTS", run: testPostNotRTS},
		{name: "FlushInErr", run: testPostFlushInErr},
		{name: "SendQueueFull", run: testSendQueueFull},
		{name: "SendQueueHeldByUnsignaled", run: testSendQueueUnsignaled},
		{name: "RecvQueueFull", run: testRecvQueueFull},
		{name: "TooManySGE", run: testTooManySGE},
		{name: "InlineTooLarge", needs: []string{CapInline}, run: testInlineTooLarge},
		{name: "OpcodeUD", needs: []string{CapUD}, run: testOpcodeUD},
		{name: "OpcodeUC", needs: []string{CapUC}, run: testOpcodeUC},
		{name: "OpcodeUnknown", run: testOpcodeUnknown},
	}
}

// Attributes of the three steps of an RC connection, for tests that walk
// the state machine by hand.
func toInit() verbs.QPAttr { return verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessAll} }

func toRTR(remote verbs.Endpoint) verbs.QPAttr {
	return verbs.QPAttr{State: verbs.StateRTR, Dest: remote}
}

func toRTS(qp verbs.QP) verbs.QPAttr {
	return verbs.QPAttr{State: verbs.StateRTS, SQPSN: qp.Endpoint().PSN, RetryCount: 7, RNRRetry: 7}
}

// modify applies a legal transition and checks the state it lands in.
func modify(t testing.TB, qp verbs.QP, attr verbs.QPAttr) {
	t.Helper()
	if err := qp.Modify(attr); err != nil {
		t.Fatalf("%s -> %s: %v", qp.State(), attr.State, err)
	}
	wantState(t, qp, attr.State)
}

// refuse checks that an illegal transition fails with ErrQPState and
// leaves the QP where it was.
func refuse(t testing.TB, qp verbs.QP, attr verbs.QPAttr) {
	t.Helper()
	from := qp.State()
	errIs(t, fmt.Sprintf("%s -> %s", from, attr.State), qp.Modify(attr), verbs.ErrQPState)
	wantState(t, qp, from)
}

// pairQPs creates an unconnected RC QP on each device.
func (e *env) pairQPs(o rcOpts) *rcPair {
	p := &rcPair{ca: e.a.cq(256), cb: e.b.cq(256)}
	p.qa = e.a.qp(verbs.QPInit{Type: verbs.RC, SendCQ: p.ca, RecvCQ: p.ca, Cap: o.cap, SignalAll: o.signalAll})
	p.qb = e.b.qp(verbs.QPInit{Type: verbs.RC, SendCQ: p.cb, RecvCQ: p.cb, Cap: o.cap, SignalAll: o.signalAll})
	return p
}

// testTransitions walks RESET -> INIT -> RTR -> RTS, trying the skips the
// IB state machine forbids on the way, then checks the QPs work.
func testTransitions(t *testing.T, e *env) {
	p := e.pairQPs(rcOpts{})
	qa, qb := p.qa, p.qb
	wantState(t, qa, verbs.StateReset)
	refuse(t, qa, toRTS(qa))
	refuse(t, qa, toRTR(qb.Endpoint()))
	modify(t, qa, toInit())
	refuse(t, qa, toRTS(qa))
	modify(t, qa, toRTR(qb.Endpoint()))
	modify(t, qa, toRTS(qa))
	refuse(t, qa, toRTR(qb.Endpoint()))
	refuse(t, qa, toInit())
	modify(t, qb, toInit())
	modify(t, qb, toRTR(qa.Endpoint()))
	modify(t, qb, toRTS(qb))
	e.writeWorks(p, 1)
}

// testEveryStep: from each state an RC QP can be walked to, the provider
// takes exactly the steps verbs.CheckTransition allows and refuses the
// rest with ErrQPState, staying where it was. A provider without a send
// queue drain may refuse SQD with ErrUnsupported.
func testEveryStep(t *testing.T, e *env) {
	for _, from := range []verbs.QPState{verbs.StateReset, verbs.StateInit, verbs.StateRTR, verbs.StateRTS, verbs.StateErr} {
		for to := verbs.StateReset; to <= verbs.StateErr; to++ {
			p := e.pairQPs(rcOpts{})
			steps := []verbs.QPAttr{toInit(), toRTR(p.qb.Endpoint()), toRTS(p.qa)}
			if from == verbs.StateErr {
				modify(t, p.qa, verbs.QPAttr{State: verbs.StateErr})
			} else {
				for _, s := range steps[:from] {
					modify(t, p.qa, s)
				}
			}
			attr := verbs.QPAttr{State: to}
			if to >= verbs.StateInit && to <= verbs.StateRTS {
				attr = steps[to-1]
			}
			_, rule := verbs.CheckTransition(verbs.RC, from, attr)
			err := p.qa.Modify(attr)
			switch {
			case rule != nil:
				errIs(t, fmt.Sprintf("%s -> %s", from, to), err, verbs.ErrQPState)
				wantState(t, p.qa, from)
			case to == verbs.StateSQD && errors.Is(err, verbs.ErrUnsupported):
				wantState(t, p.qa, from)
			case err != nil:
				t.Errorf("%s -> %s: %v, want it taken (verbs.CheckTransition allows it)", from, to, err)
			default:
				wantState(t, p.qa, to)
			}
		}
	}
}

// writeWorks does one signaled WRITE from a to b and checks it landed.
func (e *env) writeWorks(p *rcPair, id uint64) {
	e.t.Helper()
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	fill(src.mem, byte(id))
	post(e.t, p.qa, writeWR(id, src.sge(0, 64), dst, 0))
	wantOK(e.t, e.wc(p.ca), id, verbs.WCWrite, p.qa)
	if string(dst.mem) != string(src.mem) {
		e.t.Fatal("WRITE completed but the target memory does not hold the data")
	}
}

// testAnyToErr: every state can move to ERR, and ERR only to RESET.
func testAnyToErr(t *testing.T, e *env) {
	for _, reach := range []verbs.QPState{verbs.StateReset, verbs.StateInit, verbs.StateRTR, verbs.StateRTS} {
		p := e.pairQPs(rcOpts{})
		steps := []verbs.QPAttr{toInit(), toRTR(p.qb.Endpoint()), toRTS(p.qa)}
		for _, s := range steps[:reach] {
			modify(t, p.qa, s)
		}
		modify(t, p.qa, verbs.QPAttr{State: verbs.StateErr})
		refuse(t, p.qa, toRTS(p.qa))
		refuse(t, p.qa, toInit())
	}
}

// testResetReconnect: a QP in ERR is reused by resetting both sides and
// connecting them again with fresh endpoints (the recovery a shared QP
// needs).
func testResetReconnect(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	e.writeWorks(p, 1)
	for _, qp := range []verbs.QP{p.qa, p.qb} {
		modify(t, qp, verbs.QPAttr{State: verbs.StateErr})
		modify(t, qp, verbs.QPAttr{State: verbs.StateReset})
	}
	connect(t, p.qa, p.qb, verbs.Path{})
	wantState(t, p.qa, verbs.StateRTS)
	e.writeWorks(p, 2)
}

// testPostNotRTS: the send queue only accepts work in RTS (or ERR, where
// it is flushed).
func testPostNotRTS(t *testing.T, e *env) {
	p := e.pairQPs(rcOpts{})
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	try := func() {
		t.Helper()
		n, err := p.qa.PostSend([]verbs.SendWR{writeWR(1, src.sge(0, 8), dst, 0)})
		errIs(t, "PostSend in "+p.qa.State().String(), err, verbs.ErrQPState)
		if n != 0 {
			t.Errorf("PostSend in %s accepted %d WRs", p.qa.State(), n)
		}
	}
	try()
	modify(t, p.qa, toInit())
	try()
	modify(t, p.qa, toRTR(p.qb.Endpoint()))
	try()
	empty(t, p.ca)
}

// testPostFlushInErr: work posted to a QP in ERR completes, signaled or
// not, with WR_FLUSH_ERR; receives flush too.
func testPostFlushInErr(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	modify(t, p.qa, verbs.QPAttr{State: verbs.StateErr})
	unsignaled := writeWR(2, src.sge(0, 8), dst, 0)
	unsignaled.Flags = 0
	post(t, p.qa, writeWR(1, src.sge(0, 8), dst, 0), unsignaled, readWR(3, src.sge(8, 8), dst, 0))
	postRecv(t, p.qa, recvWR(4, src.sge(16, 8)))
	got := e.wcs(p.ca, 4)
	ids := map[uint64]bool{}
	for _, wc := range got {
		wantStatus(t, wc, wc.ID, verbs.WRFlushErr)
		ids[wc.ID] = true
	}
	if len(ids) != 4 {
		t.Fatalf("flushed completions %s, want one each for WRs 1-4", describe(got))
	}
	sends := []uint64{}
	for _, wc := range got {
		if wc.ID != 4 {
			sends = append(sends, wc.ID)
		}
	}
	if fmt.Sprint(sends) != "[1 2 3]" {
		t.Errorf("send queue flushed in order %v, want [1 2 3]", sends)
	}
	if dst.u64(0) != 0 {
		t.Error("a WR posted in ERR changed remote memory")
	}
}

// testSendQueueFull: a send-queue slot is held until a completion of its
// WR, or of a later signaled WR, is polled (as on mlx5), so MaxSendWR
// outstanding WRs fill the queue however fast the wire is.
func testSendQueueFull(t *testing.T, e *env) {
	const depth = 8
	p := e.rc(rcOpts{cap: verbs.QPCap{MaxSendWR: depth}})
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	batch := func(base uint64, n int) []verbs.SendWR {
		wrs := make([]verbs.SendWR, n)
		for i := range wrs {
			wrs[i] = writeWR(base+uint64(i), src.sge(0, 8), dst, 0)
			if i < depth-1 {
				wrs[i].Flags = 0
			}
		}
		return wrs
	}
	// One batch one longer than the queue: the last WR is refused.
	wrs := batch(0, depth+1)
	n, err := p.qa.PostSend(wrs)
	errIs(t, "PostSend of MaxSendWR+1 WRs", err, verbs.ErrQueueFull)
	if n != depth {
		t.Fatalf("PostSend accepted %d of %d WRs, want %d (wr[n] is the refused one)", n, depth+1, depth)
	}
	_, err = p.qa.PostSend(batch(100, 1))
	errIs(t, "PostSend on a full queue", err, verbs.ErrQueueFull)
	// Polling the signaled completion frees every slot up to it.
	wantOK(t, e.wc(p.ca), depth-1, verbs.WCWrite, p.qa)
	post(t, p.qa, batch(200, depth)...)
	wantOK(t, e.wc(p.ca), 200+depth-1, verbs.WCWrite, p.qa)
	empty(t, p.ca)
}

// testSendQueueUnsignaled: MaxSendWR unsignaled WRs fill the queue for
// good. They complete on the wire, but with no signaled completion to
// poll their slots are never freed, so one more WR is refused: the
// classic pitfall a shared QP's credit scheme must avoid.
func testSendQueueUnsignaled(t *testing.T, e *env) {
	const depth = 8
	p := e.rc(rcOpts{cap: verbs.QPCap{MaxSendWR: depth}})
	src, dst := e.a.mr(8, verbs.AccessAll), e.b.mr(depth*8, verbs.AccessAll)
	fill(src.mem, 1) // no zero byte, so each WRITE's arrival shows
	wrs := make([]verbs.SendWR, depth)
	for i := range wrs {
		wrs[i] = writeWR(uint64(i), src.sge(0, 8), dst, i*8)
		wrs[i].Flags = 0
	}
	post(t, p.qa, wrs...)
	e.eventually("the last unsignaled WRITE to land", func() bool { return dst.mem[depth*8-1] != 0 })
	n, err := p.qa.PostSend([]verbs.SendWR{writeWR(99, src.sge(0, 8), dst, 0)})
	errIs(t, "PostSend after MaxSendWR unsignaled WRs", err, verbs.ErrQueueFull)
	if n != 0 {
		t.Errorf("PostSend accepted %d", n)
	}
	empty(t, p.ca)
}

// testRecvQueueFull: the receive queue holds MaxRecvWR buffers.
func testRecvQueueFull(t *testing.T, e *env) {
	const depth = 8
	p := e.rc(rcOpts{cap: verbs.QPCap{MaxRecvWR: depth}})
	buf := e.b.mr(64, verbs.AccessAll)
	wrs := make([]verbs.RecvWR, depth+1)
	for i := range wrs {
		wrs[i] = recvWR(uint64(i), buf.sge(0, 64))
	}
	n, err := p.qb.PostRecv(wrs)
	errIs(t, "PostRecv of MaxRecvWR+1 receives", err, verbs.ErrQueueFull)
	if n != depth {
		t.Fatalf("PostRecv accepted %d of %d, want %d", n, depth+1, depth)
	}
	// A SEND consumes one; its slot is free again once polled.
	src := e.a.mr(64, verbs.AccessAll)
	post(t, p.qa, sendWR(1, src.sge(0, 8)))
	wantOK(t, e.wc(p.ca), 1, verbs.WCSend, p.qa)
	wantOK(t, e.wc(p.cb), 0, verbs.WCRecv, p.qb)
	postRecv(t, p.qb, recvWR(99, buf.sge(0, 64)))
}

// testTooManySGE: more SGEs than the QP was created with are refused at
// post time, without consuming the WRs before it in the batch.
func testTooManySGE(t *testing.T, e *env) {
	if e.a.dev.Attr().MaxSGE < 2 {
		t.Skip("device allows one SGE per WR; cannot create a QP with fewer")
	}
	p := e.rc(rcOpts{cap: verbs.QPCap{MaxSendSGE: 1, MaxRecvSGE: 1}})
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	two := []verbs.SGE{src.sge(0, 8), src.sge(8, 8)}
	bad := writeWR(2, src.sge(0, 8), dst, 0)
	bad.SGL = two
	n, err := p.qa.PostSend([]verbs.SendWR{writeWR(1, src.sge(0, 8), dst, 0), bad, writeWR(3, src.sge(0, 8), dst, 0)})
	errIs(t, "PostSend with 2 SGEs on a 1-SGE QP", err, verbs.ErrLimit)
	if n != 1 {
		t.Fatalf("PostSend accepted %d WRs, want 1 (the one before the bad WR)", n)
	}
	wantOK(t, e.wc(p.ca), 1, verbs.WCWrite, p.qa)
	n, err = p.qb.PostRecv([]verbs.RecvWR{recvWR(1, two...)})
	errIs(t, "PostRecv with 2 SGEs on a 1-SGE QP", err, verbs.ErrLimit)
	if n != 0 {
		t.Errorf("PostRecv accepted %d", n)
	}
	empty(t, p.ca)
}

// testInlineTooLarge: inline data is copied into the WQE, so it is bounded
// by the QP's MaxInline.
func testInlineTooLarge(t *testing.T, e *env) {
	lim := min(64, e.a.dev.Attr().MaxInline)
	p := e.rc(rcOpts{cap: verbs.QPCap{MaxInline: lim}})
	src, dst := e.a.mr(256, verbs.AccessAll), e.b.mr(256, verbs.AccessAll)
	wr := writeWR(1, src.sge(0, lim+1), dst, 0)
	wr.Flags |= verbs.Inline
	n, err := p.qa.PostSend([]verbs.SendWR{wr})
	errIs(t, fmt.Sprintf("inline WRITE of %d bytes with MaxInline %d", lim+1, lim), err, verbs.ErrLimit)
	if n != 0 {
		t.Errorf("PostSend accepted %d", n)
	}
	wr.SGL = []verbs.SGE{src.sge(0, lim)}
	post(t, p.qa, wr)
	wantOK(t, e.wc(p.ca), 1, verbs.WCWrite, p.qa)
}

// refuseOp checks that PostSend refuses wr with ErrInvalid.
func refuseOp(t testing.TB, qp verbs.QP, wr verbs.SendWR) {
	t.Helper()
	n, err := qp.PostSend([]verbs.SendWR{wr})
	errIs(t, fmt.Sprintf("%s on %s", wr.Op, qp.Type()), err, verbs.ErrInvalid)
	if n != 0 {
		t.Errorf("%s on %s: accepted", wr.Op, qp.Type())
	}
}

// testOpcodeUD: UD carries only sends.
func testOpcodeUD(t *testing.T, e *env) {
	cq := e.a.cq(16)
	qp := e.a.qp(verbs.QPInit{Type: verbs.UD, SendCQ: cq, RecvCQ: cq})
	ready(t, qp, verbs.Path{QKey: 0x11})
	buf := e.a.mr(64, verbs.AccessAll)
	ah := e.a.ah(e.b.portEndpoint())
	for _, wr := range []verbs.SendWR{readWR(1, buf.sge(0, 8), buf, 0), writeWR(2, buf.sge(0, 8), buf, 0), faaWR(3, buf.sge(0, 8), buf, 8, 1)} {
		wr.AH, wr.RemoteQPN, wr.QKey = ah, qp.Num(), 0x11
		refuseOp(t, qp, wr)
	}
	empty(t, cq)
}

// testOpcodeUC: UC has no READ or atomics.
func testOpcodeUC(t *testing.T, e *env) {
	ca, cb := e.a.cq(16), e.b.cq(16)
	qa, err := e.a.pd.CreateQP(verbs.QPInit{Type: verbs.UC, SendCQ: ca, RecvCQ: ca, Cap: e.a.defaultCap()})
	if err != nil {
		t.Skipf("CreateQP(UC): %v", err)
	}
	closeLater(t, "UC QP", qa)
	qb := e.b.qp(verbs.QPInit{Type: verbs.UC, SendCQ: cb, RecvCQ: cb})
	connect(t, qa, qb, verbs.Path{})
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	refuseOp(t, qa, readWR(1, src.sge(0, 8), dst, 0))
	refuseOp(t, qa, faaWR(2, src.sge(0, 8), dst, 0, 1))
	post(t, qa, writeWR(3, src.sge(0, 8), dst, 0))
	wantOK(t, e.wc(ca), 3, verbs.WCWrite, qa)
}

// testOpcodeUnknown: an opcode outside the enum is refused.
func testOpcodeUnknown(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	src := e.a.mr(64, verbs.AccessAll)
	refuseOp(t, p.qa, verbs.SendWR{ID: 1, Op: verbs.Opcode(99), Flags: verbs.Signaled, SGL: []verbs.SGE{src.sge(0, 8)}})
	refuseOp(t, p.qa, verbs.SendWR{ID: 2, Op: 0, Flags: verbs.Signaled, SGL: []verbs.SGE{src.sge(0, 8)}})
	empty(t, p.ca)
}
