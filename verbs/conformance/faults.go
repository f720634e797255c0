package conformance

import (
	"bytes"
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

// fault is a work request that must fail. The requester QP then goes to
// ERR and flushes everything queued behind the failed WR: the fragility
// that makes sharing one QP between applications hard.
type fault struct {
	name       string
	needs      []string
	target     verbs.Access // access of b's target region; 0 means all
	local      verbs.Access // access of a's local region; 0 means all
	dereg      bool         // deregister the target before posting
	unsignaled bool         // post the failing WR unsignaled
	// wr builds the failing WR from a's local region and b's target.
	wr   func(l, r region) verbs.SendWR
	want verbs.Status
}

const regionSize = 4096

// badKey turns a valid key into one no region on the device has (with
// overwhelming probability, since keys are unpredictable).
func badKey(k uint32) uint32 { return k ^ 0x5a5a_a5a5 }

func remoteFaults() []fault {
	const rw = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead
	atomic := []string{CapAtomic}
	return []fault{
		{name: "WriteBadRKey", want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			wr := writeWR(0, l.sge(0, 64), r, 0)
			wr.RKey = badKey(wr.RKey)
			return wr
		}},
		{name: "UnsignaledWriteBadRKeyStillCompletes", unsignaled: true, want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			wr := writeWR(0, l.sge(0, 64), r, 0)
			wr.RKey = badKey(wr.RKey)
			return wr
		}},
		{name: "ReadBadRKey", want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			wr := readWR(0, l.sge(0, 64), r, 0)
			wr.RKey = badKey(wr.RKey)
			return wr
		}},
		{name: "AtomicBadRKey", needs: atomic, want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			wr := faaWR(0, l.sge(0, 8), r, 0, 1)
			wr.RKey = badKey(wr.RKey)
			return wr
		}},
		{name: "WritePastEnd", want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			return writeWR(0, l.sge(0, 16), r, regionSize-8)
		}},
		{name: "ReadBeforeStart", want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			wr := readWR(0, l.sge(0, 16), r, 0)
			wr.RemoteAddr -= 8
			return wr
		}},
		{name: "AtomicPastEnd", needs: atomic, want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			return faaWR(0, l.sge(0, 8), r, regionSize, 1)
		}},
		{name: "ReadWithoutRemoteRead", target: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic, want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			return readWR(0, l.sge(0, 64), r, 0)
		}},
		{name: "WriteWithoutRemoteWrite", target: verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic, want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			return writeWR(0, l.sge(0, 64), r, 0)
		}},
		{name: "AtomicWithoutRemoteAtomic", needs: atomic, target: rw, want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			return casWR(0, l.sge(0, 8), r, 0, r.u64(0), 42)
		}},
		{name: "WriteDeregistered", dereg: true, want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			return writeWR(0, l.sge(0, 64), r, 0)
		}},
		{name: "ReadDeregistered", dereg: true, want: verbs.RemAccessErr, wr: func(l, r region) verbs.SendWR {
			return readWR(0, l.sge(0, 64), r, 0)
		}},
		{name: "FetchAddUnaligned", needs: atomic, want: verbs.RemInvReqErr, wr: func(l, r region) verbs.SendWR {
			return faaWR(0, l.sge(0, 8), r, 4, 1)
		}},
		{name: "CompareSwapUnaligned", needs: atomic, want: verbs.RemInvReqErr, wr: func(l, r region) verbs.SendWR {
			return casWR(0, l.sge(0, 8), r, 12, 0, 1)
		}},
	}
}

func localFaults() []fault {
	return []fault{
		{name: "BadLKey", want: verbs.LocProtErr, wr: func(l, r region) verbs.SendWR {
			wr := writeWR(0, l.sge(0, 64), r, 0)
			wr.SGL[0].LKey = badKey(wr.SGL[0].LKey)
			return wr
		}},
		{name: "SGEPastMR", want: verbs.LocProtErr, wr: func(l, r region) verbs.SendWR {
			return writeWR(0, l.sge(regionSize-8, 16), r, 0)
		}},
		{name: "SGEBeforeMR", want: verbs.LocProtErr, wr: func(l, r region) verbs.SendWR {
			wr := readWR(0, l.sge(0, 16), r, 0)
			wr.SGL[0].Addr -= 8
			return wr
		}},
		// A READ scatters into local memory, which needs LOCAL_WRITE.
		{name: "ReadIntoMRWithoutLocalWrite", local: verbs.AccessRemoteRead, want: verbs.LocProtErr, wr: func(l, r region) verbs.SendWR {
			return readWR(0, l.sge(0, 64), r, 0)
		}},
	}
}

func remoteErrorTests() []testCase {
	tests := faultTests(remoteFaults())
	return append(tests, testCase{name: "RecvTooSmall", run: testRecvTooSmall})
}

func localErrorTests() []testCase { return faultTests(localFaults()) }

func faultTests(fs []fault) []testCase {
	var tests []testCase
	for _, f := range fs {
		tests = append(tests, testCase{name: f.name, needs: f.needs, run: func(t *testing.T, e *env) { runFault(t, e, f) }})
	}
	return tests
}

func orAll(a verbs.Access) verbs.Access {
	if a == 0 {
		return verbs.AccessAll
	}
	return a
}

// runFault posts the failing WR followed by two good WRITEs (one
// unsignaled) to another region, then one more WR after the failure, and
// checks: the failure's status, flushes for the rest in order, the QP in
// ERR (the responder's too, for a remote fault), and no byte of b's memory
// changed.
func runFault(t *testing.T, e *env, f fault) {
	p := e.rc(rcOpts{})
	l := e.a.mr(regionSize, orAll(f.local))
	r := e.b.mr(regionSize, orAll(f.target))
	other := e.b.mr(regionSize, verbs.AccessAll)
	fill(l.mem, 0x22)
	fill(r.mem, 0x11)
	rBefore, otherBefore := bytes.Clone(r.mem), bytes.Clone(other.mem)
	bad := f.wr(l, r)
	if f.dereg {
		if err := r.Close(); err != nil {
			t.Fatalf("deregister target: %v", err)
		}
	}
	bad.ID = 1
	if f.unsignaled {
		bad.Flags &^= verbs.Signaled
	}
	queued := writeWR(3, l.sge(64, 64), other, 64)
	queued.Flags = 0
	post(t, p.qa, bad, writeWR(2, l.sge(0, 64), other, 0), queued)

	got := e.wcs(p.ca, 3)
	wantStatus(t, got[0], 1, f.want)
	wantStatus(t, got[1], 2, verbs.WRFlushErr)
	wantStatus(t, got[2], 3, verbs.WRFlushErr)
	wantState(t, p.qa, verbs.StateErr)

	post(t, p.qa, writeWR(4, l.sge(0, 64), other, 128))
	wantStatus(t, e.wc(p.ca), 4, verbs.WRFlushErr)
	empty(t, p.ca)
	if f.want == verbs.RemAccessErr || f.want == verbs.RemInvReqErr {
		// The responder NAKed a class B or C error: its QP errs too (IB
		// spec, rxe), so the other end learns at once that the pair is
		// broken, rather than sending to a QP that no longer answers.
		wantState(t, p.qb, verbs.StateErr)
		post(t, p.qb, writeWR(5, other.sge(0, 8), l, 0))
		wantStatus(t, e.wc(p.cb), 5, verbs.WRFlushErr)
		empty(t, p.cb)
	}
	if !bytes.Equal(r.mem, rBefore) {
		t.Error("the failed WR changed the target region")
	}
	if !bytes.Equal(other.mem, otherBefore) {
		t.Error("WRs queued behind the failed one reached the target instead of flushing")
	}
}

// testRecvTooSmall: a SEND longer than the receive buffer fails on both
// sides: LOC_LEN_ERR at the receiver, REM_INV_REQ_ERR at the sender.
func testRecvTooSmall(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	postRecv(t, p.qb, recvWR(7, dst.sge(0, 16)))
	post(t, p.qa, sendWR(1, src.sge(0, 64)))
	wantStatus(t, e.wc(p.cb), 7, verbs.LocLenErr)
	wantStatus(t, e.wc(p.ca), 1, verbs.RemInvReqErr)
	wantState(t, p.qa, verbs.StateErr)
}

func rnrTests() []testCase {
	return []testCase{
		{name: "RetryExceeded", run: testRNRExceeded},
		{name: "LateReceive", run: testRNRLateReceive},
		{name: "LaterWorkWaits", run: testRNRLaterWorkWaits},
	}
}

// testRNRExceeded: an RC SEND that finds no receive is retried RNRRetry
// times, then fails with RNR_RETRY_EXC_ERR.
func testRNRExceeded(t *testing.T, e *env) {
	p := e.rc(rcOpts{path: verbs.Path{RNRRetry: 1, MinRNRTimer: time.Millisecond}})
	src := e.a.mr(64, verbs.AccessAll)
	post(t, p.qa, sendWR(1, src.sge(0, 64)))
	wantStatus(t, e.wc(p.ca), 1, verbs.RNRRetryExcErr)
	wantState(t, p.qa, verbs.StateErr)
	empty(t, p.cb)
}

// testRNRLateReceive: with retries left, a receive posted while the
// sender backs off lets the SEND through.
func testRNRLateReceive(t *testing.T, e *env) {
	p := e.rc(rcOpts{path: verbs.Path{MinRNRTimer: time.Millisecond}}) // 7 = retry forever
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	fill(src.mem, 9)
	post(t, p.qa, sendWR(1, src.sge(0, 64)))
	// The delay is the behaviour under test: the receive must come late.
	time.Sleep(20 * time.Millisecond)
	postRecv(t, p.qb, recvWR(2, dst.sge(0, 64)))
	wantOK(t, e.wc(p.ca), 1, verbs.WCSend, p.qa)
	wantOK(t, e.wc(p.cb), 2, verbs.WCRecv, p.qb)
	if !bytes.Equal(dst.mem, src.mem) {
		t.Fatal("SEND delivered after RNR differs from the data sent")
	}
}

// testRNRLaterWorkWaits: RC executes in order even across RNR back-off. A
// WRITE posted behind a SEND that met no receive must not reach the target
// before that SEND does, and the SEND, once retried, lands exactly once.
func testRNRLaterWorkWaits(t *testing.T, e *env) {
	p := e.rc(rcOpts{path: verbs.Path{MinRNRTimer: time.Millisecond}})
	src, dst, rbuf := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll), e.b.mr(128, verbs.AccessAll)
	fill(src.mem, 17)
	post(t, p.qa, sendWR(1, src.sge(0, 64)), writeWR(2, src.sge(0, 64), dst, 0))
	// The delay is the behaviour under test: the receive must come late.
	time.Sleep(20 * time.Millisecond)
	if !allZero(dst.mem) {
		t.Fatal("a WRITE overtook the SEND ahead of it that was waiting for a receive")
	}
	empty(t, p.ca)
	postRecv(t, p.qb, recvWR(10, rbuf.sge(0, 64)), recvWR(11, rbuf.sge(64, 64)))
	wantOK(t, e.wc(p.ca), 1, verbs.WCSend, p.qa)
	wantOK(t, e.wc(p.ca), 2, verbs.WCWrite, p.qa)
	wantOK(t, e.wc(p.cb), 10, verbs.WCRecv, p.qb)
	empty(t, p.cb) // receive 11 unused: the SEND was not delivered twice
	if !bytes.Equal(dst.mem, src.mem) || !allZero(rbuf.mem[64:]) {
		t.Fatal("after the receive: WRITE missing or SEND delivered twice")
	}
}
