package conformance

import (
	"bytes"
	"testing"

	"github.com/krcore/krcore/verbs"
)

func dcTests() []testCase {
	dc := []string{CapDC}
	return []testCase{
		{name: "OneDCIManyDCTs", needs: dc, run: testDCManyTargets},
		{name: "WrongKey", needs: dc, run: testDCWrongKey},
		{name: "PipelinedTargets", needs: dc, run: testDCPipelinedTargets},
	}
}

// testDCPipelinedTargets: READs to two DCTs (one on each device) posted in
// one batch, the target changing from one WR to the next: a DCI serves one
// target at a time, so each switch waits for the previous target's
// responses, and then transmission goes on by itself. Every READ
// completes, in order, with its target's bytes.
func testDCPipelinedTargets(t *testing.T, e *env) {
	dci, cq := e.a.dcInitiator()
	targets := []*dcTarget{e.b.dcTarget(0xaaaa), e.a.dcTarget(0xbbbb)}
	ahs := []verbs.AH{e.a.ah(targets[0].dct.Endpoint()), e.a.ah(targets[1].dct.Endpoint())}
	fill(targets[0].mem.mem, 0x51)
	fill(targets[1].mem.mem, 0x62)
	const reads = 6
	local := e.a.mr(reads*64, verbs.AccessAll)
	wrs := make([]verbs.SendWR, reads)
	for i := range wrs {
		d := targets[i%2]
		wrs[i] = d.via(ahs[i%2], readWR(uint64(i+1), local.sge(i*64, 64), d.mem, i*64))
	}
	post(t, dci, wrs...)
	for i, wc := range e.wcs(cq, reads) {
		wantOK(t, wc, uint64(i+1), verbs.WCRead, dci)
		if d := targets[i%2]; !bytes.Equal(local.mem[i*64:(i+1)*64], d.mem.mem[i*64:(i+1)*64]) {
			t.Fatalf("READ %d from target %d returned other bytes", i+1, i%2)
		}
	}
}

// dcTarget is a DCT with the SRQ it receives from and a region a DCI may
// access.
type dcTarget struct {
	n   *node
	dct verbs.QP
	srq verbs.SRQ
	cq  verbs.CQ
	key uint64
	mem region
}

func (n *node) dcTarget(key uint64) *dcTarget {
	n.t.Helper()
	d := &dcTarget{n: n, srq: n.srq(16), cq: n.cq(64), key: key, mem: n.mr(regionSize, verbs.AccessAll)}
	d.dct = n.qp(verbs.QPInit{Type: verbs.DCT, SendCQ: d.cq, RecvCQ: d.cq, SRQ: d.srq, DCKey: key})
	ready(n.t, d.dct, verbs.Path{})
	wantState(n.t, d.dct, verbs.StateRTR)
	return d
}

// dcInitiator is a DCI on n, ready to send.
func (n *node) dcInitiator() (verbs.QP, verbs.CQ) {
	n.t.Helper()
	cq := n.cq(64)
	dci := n.qp(verbs.QPInit{Type: verbs.DCI, SendCQ: cq, RecvCQ: cq})
	ready(n.t, dci, verbs.Path{})
	return dci, cq
}

// via addresses wr to the DCT d from a DCI whose PD holds ah.
func (d *dcTarget) via(ah verbs.AH, wr verbs.SendWR) verbs.SendWR {
	wr.AH, wr.RemoteQPN, wr.DCKey = ah, d.dct.Num(), d.key
	return wr
}

// testDCManyTargets: one DCI, no connection set-up, reaches a DCT on each
// device (one in loopback) with every opcode, alternating targets so the
// DCI re-targets on every WR.
func testDCManyTargets(t *testing.T, e *env) {
	dci, cq := e.a.dcInitiator()
	targets := []*dcTarget{e.a.dcTarget(0x1111_2222_3333), e.b.dcTarget(0xfeed_beef)}
	ahs := []verbs.AH{e.a.ah(targets[0].dct.Endpoint()), e.a.ah(targets[1].dct.Endpoint())}
	local := e.a.mr(regionSize, verbs.AccessAll)
	fill(local.mem, 12)
	atomics := e.lacks(CapAtomic) == ""
	id := uint64(0)
	do := func(i int, wr verbs.SendWR, op verbs.WCOpcode) {
		t.Helper()
		id++
		wr.ID = id
		post(t, dci, targets[i].via(ahs[i], wr))
		wantOK(t, e.wc(cq), id, op, dci)
	}
	for i, d := range targets {
		d.mem.setU64(1024, 100)
		do(i, writeWR(0, local.sge(0, 256), d.mem, 0), verbs.WCWrite)
	}
	for i, d := range targets {
		if !bytes.Equal(d.mem.mem[:256], local.mem[:256]) {
			t.Fatalf("DC WRITE to target %d did not land", i)
		}
		do(i, readWR(0, local.sge(512+i*256, 256), d.mem, 0), verbs.WCRead)
		if !bytes.Equal(local.mem[512+i*256:768+i*256], local.mem[:256]) {
			t.Fatalf("DC READ from target %d returned other data", i)
		}
	}
	if atomics {
		for i, d := range targets {
			do(i, faaWR(0, local.sge(2048, 8), d.mem, 1024, 5), verbs.WCFetchAdd)
			do(i, casWR(0, local.sge(2056, 8), d.mem, 1024, 105, 7), verbs.WCCompareSwap)
			if local.u64(2048) != 100 || local.u64(2056) != 105 || d.mem.u64(1024) != 7 {
				t.Fatalf("DC atomics on target %d: fetched %d, %d; word now %d", i, local.u64(2048), local.u64(2056), d.mem.u64(1024))
			}
		}
	} else {
		t.Log("atomics not checked over DC: device lacks them")
	}
	for i, d := range targets {
		postRecv(t, d.srq, recvWR(uint64(50+i), d.mem.sge(3072, 128)))
		do(i, sendWR(0, local.sge(0, 100)), verbs.WCSend)
		rwc := e.wc(d.cq)
		wantOK(t, rwc, uint64(50+i), verbs.WCRecv, d.dct)
		if rwc.ByteLen != 100 || !bytes.Equal(d.mem.mem[3072:3172], local.mem[:100]) {
			t.Fatalf("DC SEND to target %d: receive of %d bytes differs", i, rwc.ByteLen)
		}
	}
}

// testDCWrongKey: a DCT refuses a DCI that does not carry its key, as a
// remote access error; the DCI goes to ERR.
func testDCWrongKey(t *testing.T, e *env) {
	dci, cq := e.a.dcInitiator()
	d := e.b.dcTarget(0xc0ffee)
	ah := e.a.ah(d.dct.Endpoint())
	local := e.a.mr(64, verbs.AccessAll)
	fill(local.mem, 13)
	before := bytes.Clone(d.mem.mem)
	wr := d.via(ah, writeWR(1, local.sge(0, 64), d.mem, 0))
	wr.DCKey++
	post(t, dci, wr)
	wantStatus(t, e.wc(cq), 1, verbs.RemAccessErr)
	wantState(t, dci, verbs.StateErr)
	if !bytes.Equal(d.mem.mem, before) {
		t.Fatal("a WRITE with the wrong DC key changed the target")
	}
	empty(t, d.cq)
}
