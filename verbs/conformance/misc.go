package conformance

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

func srqTests() []testCase {
	srq := []string{CapSRQ}
	return []testCase{
		{name: "SharedByQPs", needs: srq, run: testSRQShared},
		{name: "Full", needs: srq, run: testSRQFull},
	}
}

// testSRQShared: three QPs draw their receives from one SRQ; each
// completion names the QP the message came in on. The pairs are patient:
// what is tested is the sharing, and a sender's ACK is late by any stall
// of the receiver's reading.
func testSRQShared(t *testing.T, e *env) {
	const qps, per, msg = 3, 2, 64
	srq, cb := e.b.srq(16), e.b.cq(64)
	pairs := make([]*rcPair, qps)
	for i := range pairs {
		pairs[i] = e.rc(rcOpts{srqB: srq, cb: cb, path: patientPath})
	}
	n, err := pairs[0].qb.PostRecv([]verbs.RecvWR{recvWR(0, e.b.mr(8, verbs.AccessAll).sge(0, 8))})
	errIs(t, "PostRecv on a QP that uses an SRQ", err, verbs.ErrInvalid)
	if n != 0 {
		t.Errorf("PostRecv on an SRQ QP accepted %d", n)
	}
	dst := e.b.mr(qps*per*msg, verbs.AccessAll)
	for k := range qps * per {
		postRecv(t, srq, recvWR(uint64(k), dst.sge(k*msg, msg)))
	}
	src := e.a.mr(qps*per*msg, verbs.AccessAll)
	for i, p := range pairs {
		for j := range per {
			tag := i*per + j
			binary.NativeEndian.PutUint64(src.mem[tag*msg:], uint64(tag))
			post(t, p.qa, sendWR(uint64(tag), src.sge(tag*msg, msg)))
		}
	}
	seen := map[uint64]bool{}
	for _, wc := range e.wcs(cb, qps*per) {
		if wc.Status != verbs.Success || wc.Op != verbs.WCRecv || wc.ByteLen != msg {
			t.Fatalf("SRQ receive %s", describe([]verbs.WC{wc}))
		}
		tag := dst.u64(int(wc.ID) * msg)
		if seen[tag] || tag >= qps*per {
			t.Fatalf("receive %d holds message %d twice or unknown", wc.ID, tag)
		}
		seen[tag] = true
		if want := pairs[tag/per].qb.Num(); wc.QPN != want {
			t.Fatalf("message %d arrived on QP %d, completion names QP %d", tag, want, wc.QPN)
		}
	}
	for _, p := range pairs {
		for range per {
			if wc := e.wc(p.ca); wc.Status != verbs.Success {
				t.Fatalf("sender: %s", describe([]verbs.WC{wc}))
			}
		}
	}
}

// testSRQFull: an SRQ holds MaxWR receives.
func testSRQFull(t *testing.T, e *env) {
	const depth = 8
	srq := e.b.srq(depth)
	buf := e.b.mr(64, verbs.AccessAll)
	wrs := make([]verbs.RecvWR, depth+1)
	for i := range wrs {
		wrs[i] = recvWR(uint64(i), buf.sge(0, 64))
	}
	n, err := srq.PostRecv(wrs)
	errIs(t, "PostRecv of MaxWR+1 on an SRQ", err, verbs.ErrQueueFull)
	if n != depth {
		t.Errorf("SRQ accepted %d of %d, want %d", n, depth+1, depth)
	}
}

func oneSidedTests() []testCase {
	return []testCase{{name: "NoTargetInvolvement", run: testOneSided}, {name: "SubRegistration", run: testSubRegistration}}
}

// testOneSided: READ, WRITE and atomics complete although the target
// application posts no receive and never polls.
func testOneSided(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	l, r := e.a.mr(256, verbs.AccessAll), e.b.mr(256, verbs.AccessAll)
	fill(l.mem[:64], 14)
	fill(r.mem[64:128], 15)
	r.setU64(128, 10)
	wrs := []verbs.SendWR{writeWR(1, l.sge(0, 64), r, 0), readWR(2, l.sge(64, 64), r, 64)}
	ops := []verbs.WCOpcode{verbs.WCWrite, verbs.WCRead}
	if e.lacks(CapAtomic) == "" {
		wrs = append(wrs, faaWR(3, l.sge(128, 8), r, 128, 1), casWR(4, l.sge(136, 8), r, 128, 11, 20))
		ops = append(ops, verbs.WCFetchAdd, verbs.WCCompareSwap)
	}
	post(t, p.qa, wrs...)
	for i, wc := range e.wcs(p.ca, len(wrs)) {
		wantOK(t, wc, uint64(i+1), ops[i], p.qa)
	}
	if string(r.mem[:64]) != string(l.mem[:64]) || string(l.mem[64:128]) != string(r.mem[64:128]) {
		t.Fatal("one-sided data did not move")
	}
	if len(wrs) > 2 && r.u64(128) != 20 {
		t.Fatalf("atomics left %d, want 20", r.u64(128))
	}
	empty(t, p.cb)
}

func cqTests() []testCase {
	return []testCase{
		{name: "WaitHonoursContext", run: testCQWaitContext},
		{name: "Overrun", needs: []string{CapCQOverrun}, run: testCQOverrun},
	}
}

// testCQWaitContext: Wait on an empty CQ returns the context's error when
// it ends; a Wait that ignored ctx would hang its caller forever.
func testCQWaitContext(t *testing.T, e *env) {
	cq := e.a.cq(4)
	wait := func(ctx context.Context) error {
		done := make(chan error, 1)
		go func() { done <- cq.Wait(ctx) }()
		select {
		case err := <-done:
			return err
		case <-time.After(e.o.timeout()):
			t.Fatal("CQ.Wait ignored its context")
			return nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	errIs(t, "Wait on an empty CQ past the deadline", wait(ctx), context.DeadlineExceeded)
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	errIs(t, "Wait with a cancelled context", wait(ctx), context.Canceled)
}

// testCQOverrun: more completions than a CQ holds overrun it. The CQ
// reports ErrCQOverrun instead of losing completions silently, and the QP
// feeding it goes to ERR.
func testCQOverrun(t *testing.T, e *env) {
	ca := e.a.cq(4)
	total := ca.Cap() + 4
	if total > e.a.dev.Attr().MaxQPWR {
		t.Skipf("CQ of 4 rounds up to %d entries, beyond one send queue", ca.Cap())
	}
	qa := e.a.qp(verbs.QPInit{Type: verbs.RC, SendCQ: ca, RecvCQ: ca, Cap: verbs.QPCap{MaxSendWR: total}})
	cb := e.b.cq(16)
	qb := e.b.qp(verbs.QPInit{Type: verbs.RC, SendCQ: cb, RecvCQ: cb})
	connect(t, qa, qb, verbs.Path{})
	src, dst := e.a.mr(8, verbs.AccessAll), e.b.mr(8, verbs.AccessAll)
	wrs := make([]verbs.SendWR, total)
	for i := range wrs {
		wrs[i] = writeWR(uint64(i), src.sge(0, 8), dst, 0)
	}
	post(t, qa, wrs...)

	// Polling now could drain the CQ before it overflows; wait instead for
	// the QP to fail, which the overrun causes.
	e.eventually("the QP feeding an overrun CQ to go to ERR", func() bool { return qa.State() == verbs.StateErr })
	ctx, cancel := context.WithTimeout(context.Background(), e.o.timeout())
	defer cancel()
	buf := make([]verbs.WC, 4)
	for polled := 0; ; {
		n, err := ca.Poll(buf)
		polled += n
		if err == nil && n == 0 {
			err = ca.Wait(ctx)
		}
		if errors.Is(err, verbs.ErrCQOverrun) {
			return
		}
		if err != nil {
			t.Fatalf("after %d completions from an overrun CQ of %d: %v, want ErrCQOverrun", polled, ca.Cap(), err)
		}
		if polled > total {
			t.Fatalf("polled %d completions for %d WRs", polled, total)
		}
	}
}

func linkTests() []testCase {
	return []testCase{
		{name: "KillLink", needs: []string{CapLinkKill}, run: testKillLink},
		{name: "UnknownQPN", needs: []string{CapRetry}, run: testUnknownQPN},
	}
}

// testKillLink: once the link is gone, RC work fails with RETRY_EXC_ERR
// within a bounded time instead of hanging.
func testKillLink(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	l, r := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	post(t, p.qa, readWR(1, l.sge(0, 8), r, 0))
	wantOK(t, e.wc(p.ca), 1, verbs.WCRead, p.qa)
	// READ 2 races the kill, READ 3 surely follows it: whichever fails
	// first must time out, and anything behind it flushes.
	post(t, p.qa, readWR(2, l.sge(8, 8), r, 8))
	if err := e.o.KillLink(e.a.dev, e.b.dev); err != nil {
		t.Fatalf("KillLink: %v", err)
	}
	post(t, p.qa, readWR(3, l.sge(16, 8), r, 16))
	start := time.Now()
	got := e.wcsWithin(p.ca, 2, e.o.retryDeadline())
	t.Logf("link death reported after %v: %s", time.Since(start), describe(got))
	switch {
	case got[0].Status == verbs.Success:
		wantOK(t, got[0], 2, verbs.WCRead, p.qa)
		wantStatus(t, got[1], 3, verbs.RetryExcErr)
	default:
		wantStatus(t, got[0], 2, verbs.RetryExcErr)
		wantStatus(t, got[1], 3, verbs.WRFlushErr)
	}
	wantState(t, p.qa, verbs.StateErr)
}

// testUnknownQPN: RC set-up needs the remote side. A QP connected to a QP
// number nobody owns (here, a destroyed one) never gets an answer, and
// its READ fails with RETRY_EXC_ERR.
func testUnknownQPN(t *testing.T, e *env) {
	ca, cb := e.a.cq(16), e.b.cq(16)
	qa := e.a.qp(verbs.QPInit{Type: verbs.RC, SendCQ: ca, RecvCQ: ca})
	gone, err := e.b.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cb, RecvCQ: cb, Cap: e.b.defaultCap()})
	if err != nil {
		t.Fatalf("CreateQP: %v", err)
	}
	bogus := gone.Endpoint()
	if err := gone.Close(); err != nil {
		t.Fatalf("close QP: %v", err)
	}
	if err := verbs.Connect(qa, bogus, verbs.Path{}); err != nil {
		t.Fatalf("connect to a destroyed QP number: %v (the local side cannot know yet)", err)
	}
	l, r := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	post(t, qa, readWR(1, l.sge(0, 8), r, 0))
	start := time.Now()
	wantStatus(t, e.wcsWithin(ca, 1, e.o.retryDeadline())[0], 1, verbs.RetryExcErr)
	t.Logf("RETRY_EXC_ERR after %v", time.Since(start))
	wantState(t, qa, verbs.StateErr)
}
