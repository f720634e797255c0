package conformance

import (
	"bytes"
	"testing"

	"github.com/krcore/krcore/verbs"
)

// inFlightTests check that a completion tells the truth about requests
// that were still waiting for their responses when something else
// happened on their QP: a later request failing its local check, or the
// QP being reset and made ready again at the same PSN.
func inFlightTests() []testCase {
	dc := []string{CapDC}
	hold := []string{CapHoldResponses}
	return []testCase{
		{name: "LocalErrorBehindInFlight/RC", run: func(t *testing.T, e *env) { testLocalErrorBehindInFlight(t, e, e.rcReader()) }},
		{name: "LocalErrorBehindInFlight/DCI", needs: dc, run: func(t *testing.T, e *env) { testLocalErrorBehindInFlight(t, e, e.dcReader()) }},
		{name: "StaleAfterReset/RC", needs: hold, run: func(t *testing.T, e *env) { testStaleAfterReset(t, e, e.rcReader()) }},
		{name: "StaleAfterReset/DCI", needs: append(hold, CapDC), run: func(t *testing.T, e *env) { testStaleAfterReset(t, e, e.dcReader()) }},
	}
}

// inFlightReads is how many READs a test keeps outstanding at once.
const inFlightReads = 8

// inFlightChunk is the size of each of those READs.
const inFlightChunk = 512

// reader is a requester QP on a that READs from a region on b.
type reader struct {
	qp     verbs.QP
	cq     verbs.CQ
	remote region
	// address fills in what a WR needs to reach remote (a DCI's AH, DCT
	// number and key; nothing for RC).
	address func(verbs.SendWR) verbs.SendWR
	// rearm resets the requester (and for RC its peer) and makes it ready
	// again with the PSNs it had.
	rearm func()
}

func (r *reader) read(id uint64, dst verbs.SGE, off int) verbs.SendWR {
	return r.address(readWR(id, dst, r.remote, off))
}

// rcReader is an RC pair; rearm resets both QPs and connects them again.
func (e *env) rcReader() *reader {
	p := e.rc(rcOpts{})
	same := func(wr verbs.SendWR) verbs.SendWR { return wr }
	return &reader{qp: p.qa, cq: p.ca, remote: e.b.mr(regionSize, verbs.AccessAll), address: same, rearm: func() {
		for _, q := range []verbs.QP{p.qa, p.qb} {
			if err := q.Modify(verbs.QPAttr{State: verbs.StateReset}); err != nil {
				e.t.Fatalf("reset %s QP %d: %v", q.Type(), q.Num(), err)
			}
		}
		connect(e.t, p.qa, p.qb, verbs.Path{})
	}}
}

// dcReader is a DCI on a reaching a DCT on b; rearm resets the DCI and
// makes it ready again.
func (e *env) dcReader() *reader {
	dci, cq := e.a.dcInitiator()
	d := e.b.dcTarget(0x5eed_f00d)
	ah := e.a.ah(d.dct.Endpoint())
	return &reader{qp: dci, cq: cq, remote: d.mem, address: func(wr verbs.SendWR) verbs.SendWR { return d.via(ah, wr) }, rearm: func() {
		if err := dci.Modify(verbs.QPAttr{State: verbs.StateReset}); err != nil {
			e.t.Fatalf("reset DCI %d: %v", dci.Num(), err)
		}
		ready(e.t, dci, verbs.Path{})
	}}
}

// hold starts holding a's responses if the provider can; release is a
// no-op otherwise.
func (e *env) hold() (held func() int, release func()) {
	if e.o.HoldResponses == nil {
		return func() int { return 0 }, func() {}
	}
	held, release = e.o.HoldResponses(e.a.dev)
	e.t.Cleanup(release)
	return held, release
}

// testLocalErrorBehindInFlight: READs, a WRITE and (with atomics) a
// FETCH_ADD are posted, then a READ into a deregistered MR, which fails its
// local check while the requests before it may still wait for their
// responses (held back when the provider can: then nothing may complete
// before they are let go). Every completion is in posting order and either
// SUCCESS with the request's effect in place (the READ's bytes in its
// buffer, the WRITE's at the target, the atomic's original value fetched)
// or an error: never SUCCESS without its response. The failing READ
// itself never succeeds.
func testLocalErrorBehindInFlight(t *testing.T, e *env, r *reader) {
	fill(r.remote.mem, 0x31)
	local := e.a.mr(inFlightReads*inFlightChunk, verbs.AccessAll)
	gone := e.a.mr(inFlightChunk, verbs.AccessAll)
	if err := gone.Close(); err != nil {
		t.Fatalf("deregister: %v", err)
	}
	// Slot i of local and remote belongs to request i+1: READs, then a
	// WRITE from local to remote, then a FETCH_ADD (another READ without
	// atomics).
	const writeSlot, atomicSlot = inFlightReads - 2, inFlightReads - 1
	slot := func(i int) (int, int) { return i * inFlightChunk, (i + 1) * inFlightChunk }
	fill(local.mem[writeSlot*inFlightChunk:(writeSlot+1)*inFlightChunk], 0x77)
	atomics := e.lacks(CapAtomic) == ""
	before := r.remote.u64(atomicSlot * inFlightChunk)
	wrs := make([]verbs.SendWR, 0, inFlightReads+1)
	for i := range inFlightReads {
		id, lo := uint64(i+1), i*inFlightChunk
		switch {
		case i == writeSlot:
			wrs = append(wrs, r.address(writeWR(id, local.sge(lo, inFlightChunk), r.remote, lo)))
		case i == atomicSlot && atomics:
			wrs = append(wrs, r.address(faaWR(id, local.sge(lo, 8), r.remote, lo, 3)))
		default:
			wrs = append(wrs, r.read(id, local.sge(lo, inFlightChunk), lo))
		}
	}
	culprit := uint64(inFlightReads + 1)
	wrs = append(wrs, r.read(culprit, gone.sge(0, inFlightChunk), 0))
	held, release := e.hold()
	post(t, r.qp, wrs...)
	if e.o.HoldResponses != nil {
		e.eventually("responses to be held", func() bool { return held() > 0 })
		empty(t, r.cq) // the first request waits for its response: nothing may complete
	}
	release()
	got := e.wcs(r.cq, len(wrs))
	ok := 0
	for i, wc := range got {
		if wc.ID != uint64(i+1) {
			t.Fatalf("completions out of posting order: %s", describe(got))
		}
		if wc.ID == culprit {
			if wc.Status == verbs.Success {
				t.Fatalf("the READ into a deregistered MR completed SUCCESS: %s", describe(got))
			}
			continue
		}
		if wc.Status != verbs.Success {
			continue
		}
		lo, hi := slot(i)
		switch {
		case i == writeSlot:
			if !bytes.Equal(r.remote.mem[lo:hi], local.mem[lo:hi]) {
				t.Fatalf("WRITE %d completed SUCCESS but its bytes are not at the target: %s", wc.ID, describe(got))
			}
		case i == atomicSlot && atomics:
			if local.u64(lo) != before || r.remote.u64(lo) != before+3 {
				t.Fatalf("FETCH_ADD %d completed SUCCESS but fetched %#x (word was %#x, now %#x): %s", wc.ID, local.u64(lo), before, r.remote.u64(lo), describe(got))
			}
		default:
			if !bytes.Equal(local.mem[lo:hi], r.remote.mem[lo:hi]) {
				t.Fatalf("READ %d completed SUCCESS but its buffer does not hold the remote bytes: %s", wc.ID, describe(got))
			}
		}
		ok++
	}
	t.Logf("%d of %d requests ahead of the failing one completed SUCCESS with their effect; the failing one: %s", ok, inFlightReads, got[len(got)-1].Status)
	empty(t, r.cq)
}

// testStaleAfterReset: READs are posted and their responses held back;
// the QP is reset and made ready again with the same PSNs, the remote
// bytes change, and new READs are posted; then the held responses are
// let go. The new READs must complete SUCCESS with the new bytes: a
// response meant for the QP's previous life never completes them (with
// old bytes, or BAD_RESP_ERR).
func testStaleAfterReset(t *testing.T, e *env, r *reader) {
	fill(r.remote.mem, 0x41)
	local := e.a.mr(inFlightReads*inFlightChunk, verbs.AccessAll)
	held, release := e.hold()
	reads := func(base uint64) []verbs.SendWR {
		wrs := make([]verbs.SendWR, inFlightReads)
		for i := range wrs {
			wrs[i] = r.read(base+uint64(i), local.sge(i*inFlightChunk, inFlightChunk), i*inFlightChunk)
		}
		return wrs
	}
	post(t, r.qp, reads(1)...)
	// The old READs are all answered (their responses held), so none is
	// still on its way to a responder that the reset would serve anew.
	e.eventually("the old READs' responses to be held", func() bool { return held() >= inFlightReads })
	r.rearm()
	fill(r.remote.mem, 0x97)
	clear(local.mem)
	post(t, r.qp, reads(101)...)
	release()
	got := e.wcs(r.cq, inFlightReads)
	for i, wc := range got {
		if wc.ID != uint64(101+i) {
			t.Fatalf("completions %s, want READs 101.. in order (the reset drops the old ones)", describe(got))
		}
		if wc.Status != verbs.Success {
			t.Fatalf("READ %d after the reset: %s, want SUCCESS (a stale response reached it?): %s", wc.ID, wc.Status, describe(got))
		}
		off := i * inFlightChunk
		if !bytes.Equal(local.mem[off:off+inFlightChunk], r.remote.mem[off:off+inFlightChunk]) {
			t.Fatalf("READ %d after the reset completed SUCCESS with bytes that are not the remote's now (an old response's?)", wc.ID)
		}
	}
	empty(t, r.cq)
}
