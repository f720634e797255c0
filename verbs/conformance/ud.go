package conformance

import (
	"bytes"
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

// grh is the Global Routing Header every UD receive starts with.
const grh = 40

// udQKey is the queue key of the suite's UD QPs.
const udQKey = 0x1234

func udTests() []testCase {
	ud := []string{CapUD}
	return []testCase{
		{name: "Send", needs: ud, run: testUDSend},
		{name: "MTU", needs: ud, run: testUDMTU},
		{name: "WrongQKey", needs: ud, run: testUDWrongQKey},
	}
}

// udPair is a UD QP on each device and an address handle on a for b.
type udPair struct {
	qa, qb verbs.QP
	ca, cb verbs.CQ
	ah     verbs.AH
}

func (e *env) ud() *udPair {
	e.t.Helper()
	u := &udPair{ca: e.a.cq(64), cb: e.b.cq(64)}
	u.qa = e.a.qp(verbs.QPInit{Type: verbs.UD, SendCQ: u.ca, RecvCQ: u.ca})
	u.qb = e.b.qp(verbs.QPInit{Type: verbs.UD, SendCQ: u.cb, RecvCQ: u.cb})
	ready(e.t, u.qa, verbs.Path{QKey: udQKey})
	ready(e.t, u.qb, verbs.Path{QKey: udQKey})
	u.ah = e.a.ah(u.qb.Endpoint())
	return u
}

// send builds a UD SEND from a to b.
func (u *udPair) send(id uint64, sge verbs.SGE, qkey uint32) verbs.SendWR {
	wr := sendWR(id, sge)
	wr.AH, wr.RemoteQPN, wr.QKey = u.ah, u.qb.Num(), qkey
	return wr
}

// testUDSend: the receive holds the 40-byte GRH and then the payload, and
// names the sender's QP.
func testUDSend(t *testing.T, e *env) {
	u := e.ud()
	src, dst := e.a.mr(256, verbs.AccessAll), e.b.mr(512, verbs.AccessAll)
	fill(src.mem, 10)
	postRecv(t, u.qb, recvWR(1, dst.sge(0, grh+256)), recvWR(2, dst.sge(grh+256, grh+100)))
	post(t, u.qa, u.send(1, src.sge(0, 200), udQKey))
	imm := u.send(2, src.sge(0, 100), udQKey)
	imm.Op, imm.Imm = verbs.OpSendImm, 77
	post(t, u.qa, imm)
	for i, wc := range e.wcs(u.ca, 2) {
		wantOK(t, wc, uint64(i+1), verbs.WCSend, u.qa)
	}
	got := e.wcs(u.cb, 2)
	for i, n := range []int{200, 100} {
		wc := got[i]
		wantOK(t, wc, uint64(i+1), verbs.WCRecv, u.qb)
		if wc.ByteLen != uint32(grh+n) || wc.SrcQPN != u.qa.Num() {
			t.Fatalf("UD receive %d: ByteLen %d SrcQPN %d, want %d and %d", i+1, wc.ByteLen, wc.SrcQPN, grh+n, u.qa.Num())
		}
	}
	if !bytes.Equal(dst.mem[grh:grh+200], src.mem[:200]) {
		t.Fatal("UD payload does not follow the 40-byte GRH")
	}
	if got[0].HasImm || !got[1].HasImm || got[1].Imm != 77 {
		t.Fatalf("immediate: HasImm %v/%v Imm %d, want false/true 77", got[0].HasImm, got[1].HasImm, got[1].Imm)
	}
}

// testUDMTU: a UD message is one packet: up to the path MTU it is
// delivered, one byte more fails locally with LOC_LEN_ERR.
func testUDMTU(t *testing.T, e *env) {
	mtu := min(e.a.dev.Port().MTU, e.b.dev.Port().MTU)
	u := e.ud()
	src, dst := e.a.mr(mtu+1, verbs.AccessAll), e.b.mr(grh+mtu+1, verbs.AccessAll)
	postRecv(t, u.qb, recvWR(1, dst.sge(0, grh+mtu+1)))
	post(t, u.qa, u.send(1, src.sge(0, mtu), udQKey))
	wantOK(t, e.wc(u.ca), 1, verbs.WCSend, u.qa)
	if wc := e.wc(u.cb); wc.ByteLen != uint32(grh+mtu) {
		t.Fatalf("MTU-sized UD receive: ByteLen %d, want %d", wc.ByteLen, grh+mtu)
	}
	postRecv(t, u.qb, recvWR(2, dst.sge(0, grh+mtu+1)))
	post(t, u.qa, u.send(2, src.sge(0, mtu+1), udQKey))
	wantStatus(t, e.wc(u.ca), 2, verbs.LocLenErr)
	e.none(u.cb, 20*time.Millisecond)
}

// testUDWrongQKey: a datagram with the wrong Q_Key is dropped by the
// receiver while the sender sees success (UD has no acknowledgements). A
// correct datagram sent after it is the barrier that proves the drop.
func testUDWrongQKey(t *testing.T, e *env) {
	u := e.ud()
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(2*(grh+64), verbs.AccessAll)
	fill(src.mem[:32], 1)
	fill(src.mem[32:], 2)
	postRecv(t, u.qb, recvWR(1, dst.sge(0, grh+64)), recvWR(2, dst.sge(grh+64, grh+64)))
	post(t, u.qa, u.send(1, src.sge(0, 32), udQKey+1), u.send(2, src.sge(32, 32), udQKey))
	for i, wc := range e.wcs(u.ca, 2) {
		wantOK(t, wc, uint64(i+1), verbs.WCSend, u.qa)
	}
	wc := e.wc(u.cb)
	wantOK(t, wc, 1, verbs.WCRecv, u.qb)
	if !bytes.Equal(dst.mem[grh:grh+32], src.mem[32:]) {
		t.Fatal("the first receive holds the datagram sent with the wrong Q_Key")
	}
	e.none(u.cb, 20*time.Millisecond)
}
