package conformance

import (
	"bytes"
	"testing"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

func rcTests() []testCase {
	return []testCase{
		{name: "Write", run: testWrite},
		{name: "Read", run: testRead},
		{name: "Send", run: testSend},
		{name: "SendWithImm", run: testSendImm},
		{name: "WriteWithImm", run: testWriteImm},
		{name: "CompareSwap", needs: []string{CapAtomic}, run: testCompareSwap},
		{name: "FetchAdd", needs: []string{CapAtomic}, run: testFetchAdd},
		{name: "GatherScatter", run: testGatherScatter},
		{name: "Inline", needs: []string{CapInline}, run: testInline},
		{name: "Unsignaled", run: testUnsignaled},
		{name: "SignalAll", run: testSignalAll},
		{name: "Fence", run: testFence},
		{name: "Loopback", run: testLoopback},
	}
}

// sizes crosses the interesting boundaries: one byte, just past a 4 KiB
// MTU, and many packets.
var sizes = []int{1, 4097, 64 << 10}

func testWrite(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	for i, n := range sizes {
		src, dst := e.a.mr(n+16, verbs.AccessAll), e.b.mr(n+16, verbs.AccessAll)
		fill(src.mem, byte(i))
		post(t, p.qa, writeWR(uint64(i), src.sge(8, n), dst, 8))
		wantOK(t, e.wc(p.ca), uint64(i), verbs.WCWrite, p.qa)
		if !bytes.Equal(dst.mem[8:8+n], src.mem[8:8+n]) {
			t.Fatalf("WRITE of %d bytes: target differs", n)
		}
		if !allZero(dst.mem[:8]) || !allZero(dst.mem[8+n:]) {
			t.Fatalf("WRITE of %d bytes touched memory outside the remote range", n)
		}
	}
	empty(t, p.cb)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func testRead(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	for i, n := range sizes {
		dst, src := e.a.mr(n+16, verbs.AccessAll), e.b.mr(n+16, verbs.AccessAll)
		fill(src.mem, byte(i+1))
		post(t, p.qa, readWR(uint64(i), dst.sge(8, n), src, 8))
		wc := e.wc(p.ca)
		wantOK(t, wc, uint64(i), verbs.WCRead, p.qa)
		if !bytes.Equal(dst.mem[8:8+n], src.mem[8:8+n]) {
			t.Fatalf("READ of %d bytes: local buffer differs from the remote", n)
		}
		if !allZero(dst.mem[:8]) || !allZero(dst.mem[8+n:]) {
			t.Fatalf("READ of %d bytes wrote outside the local SGE", n)
		}
	}
	empty(t, p.cb)
}

func testSend(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	for i, n := range []int{0, 100, 16 << 10} {
		src, dst := e.a.mr(n+1, verbs.AccessAll), e.b.mr(n+64, verbs.AccessAll)
		fill(src.mem, byte(i+2))
		postRecv(t, p.qb, recvWR(uint64(100+i), dst.sge(0, n+64)))
		wr := sendWR(uint64(i))
		if n > 0 {
			wr.SGL = []verbs.SGE{src.sge(0, n)}
		}
		post(t, p.qa, wr)
		wantOK(t, e.wc(p.ca), uint64(i), verbs.WCSend, p.qa)
		rwc := e.wc(p.cb)
		wantOK(t, rwc, uint64(100+i), verbs.WCRecv, p.qb)
		if rwc.ByteLen != uint32(n) || rwc.HasImm {
			t.Fatalf("receive of a %d-byte SEND: ByteLen %d HasImm %v", n, rwc.ByteLen, rwc.HasImm)
		}
		if !bytes.Equal(dst.mem[:n], src.mem[:n]) || !allZero(dst.mem[n:]) {
			t.Fatalf("receive buffer does not hold exactly the %d bytes sent", n)
		}
	}
}

func testSendImm(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	fill(src.mem, 3)
	postRecv(t, p.qb, recvWR(7, dst.sge(0, 64)))
	wr := sendWR(1, src.sge(0, 40))
	wr.Op, wr.Imm = verbs.OpSendImm, 0xdeadbeef
	post(t, p.qa, wr)
	wantOK(t, e.wc(p.ca), 1, verbs.WCSend, p.qa)
	rwc := e.wc(p.cb)
	wantOK(t, rwc, 7, verbs.WCRecv, p.qb)
	if !rwc.HasImm || rwc.Imm != 0xdeadbeef || rwc.ByteLen != 40 {
		t.Fatalf("receive: HasImm %v Imm %#x ByteLen %d, want true 0xdeadbeef 40", rwc.HasImm, rwc.Imm, rwc.ByteLen)
	}
	if !bytes.Equal(dst.mem[:40], src.mem[:40]) {
		t.Fatal("receive buffer differs from the data sent")
	}
}

// testWriteImm: the data goes where the WRITE says, and the immediate
// consumes a receive (whose buffer stays untouched).
func testWriteImm(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	src, dst, rbuf := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	fill(src.mem, 4)
	for i, n := range []int{64, 0} {
		postRecv(t, p.qb, recvWR(uint64(10+i), rbuf.sge(0, 64)))
		wr := writeWR(uint64(i), src.sge(0, n), dst, 0)
		wr.Op, wr.Imm = verbs.OpWriteImm, uint32(0x1234+i)
		if n == 0 {
			wr.SGL = nil
		}
		post(t, p.qa, wr)
		wantOK(t, e.wc(p.ca), uint64(i), verbs.WCWrite, p.qa)
		rwc := e.wc(p.cb)
		wantOK(t, rwc, uint64(10+i), verbs.WCRecvWriteImm, p.qb)
		if !rwc.HasImm || rwc.Imm != uint32(0x1234+i) || rwc.ByteLen != uint32(n) {
			t.Fatalf("WRITE_WITH_IMM of %d bytes: receive HasImm %v Imm %#x ByteLen %d", n, rwc.HasImm, rwc.Imm, rwc.ByteLen)
		}
	}
	if !bytes.Equal(dst.mem, src.mem) {
		t.Fatal("WRITE_WITH_IMM data missing at the remote address")
	}
	if !allZero(rbuf.mem) {
		t.Fatal("WRITE_WITH_IMM wrote into the receive buffer")
	}
}

// atomicPair sets up an RC pair, an 8-byte result buffer on a and a
// target word on b.
func (e *env) atomicPair() (*rcPair, region, region) {
	return e.rc(rcOpts{}), e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
}

func testCompareSwap(t *testing.T, e *env) {
	p, res, tgt := e.atomicPair()
	tgt.setU64(8, 0x1111_2222_3333_4444)
	// A miss returns the current value and leaves it.
	post(t, p.qa, casWR(1, res.sge(0, 8), tgt, 8, 5, 6))
	wantOK(t, e.wc(p.ca), 1, verbs.WCCompareSwap, p.qa)
	if res.u64(0) != 0x1111_2222_3333_4444 || tgt.u64(8) != 0x1111_2222_3333_4444 {
		t.Fatalf("CAS miss: result %#x target %#x", res.u64(0), tgt.u64(8))
	}
	// A hit returns the old value and swaps.
	post(t, p.qa, casWR(2, res.sge(8, 8), tgt, 8, 0x1111_2222_3333_4444, 0xabcdef))
	wantOK(t, e.wc(p.ca), 2, verbs.WCCompareSwap, p.qa)
	if res.u64(8) != 0x1111_2222_3333_4444 || tgt.u64(8) != 0xabcdef {
		t.Fatalf("CAS hit: result %#x target %#x", res.u64(8), tgt.u64(8))
	}
	if tgt.u64(0) != 0 || tgt.u64(16) != 0 {
		t.Fatal("CAS touched neighbouring words")
	}
}

func testFetchAdd(t *testing.T, e *env) {
	p, res, tgt := e.atomicPair()
	tgt.setU64(0, 1<<32-1)
	post(t, p.qa, faaWR(1, res.sge(0, 8), tgt, 0, 1))
	wantOK(t, e.wc(p.ca), 1, verbs.WCFetchAdd, p.qa)
	if res.u64(0) != 1<<32-1 || tgt.u64(0) != 1<<32 {
		t.Fatalf("FAA: result %#x target %#x, want %#x %#x (carry into the high word)", res.u64(0), tgt.u64(0), uint64(1<<32-1), uint64(1<<32))
	}
	// Wrap-around is modulo 2^64.
	post(t, p.qa, faaWR(2, res.sge(8, 8), tgt, 0, ^uint64(0)))
	wantOK(t, e.wc(p.ca), 2, verbs.WCFetchAdd, p.qa)
	if res.u64(8) != 1<<32 || tgt.u64(0) != 1<<32-1 {
		t.Fatalf("FAA of -1: result %#x target %#x", res.u64(8), tgt.u64(0))
	}
}

// testGatherScatter: SGLs gather from and scatter to several regions for
// SEND, WRITE and READ.
func testGatherScatter(t *testing.T, e *env) {
	if e.a.dev.Attr().MaxSGE < 3 || e.b.dev.Attr().MaxSGE < 3 {
		t.Skip("device allows fewer than 3 SGEs per WR")
	}
	p := e.rc(rcOpts{cap: verbs.QPCap{MaxSendSGE: 3, MaxRecvSGE: 3}})
	s1, s2 := e.a.mr(256, verbs.AccessAll), e.a.mr(256, verbs.AccessAll)
	fill(s1.mem, 5)
	fill(s2.mem, 6)
	gather := []verbs.SGE{s1.sge(10, 100), s2.sge(0, 50), s1.sge(200, 6)}
	want := join(s1.mem[10:110], s2.mem[:50], s1.mem[200:206])

	// SEND gathers three pieces and the receive scatters them over three.
	r1, r2 := e.b.mr(256, verbs.AccessAll), e.b.mr(256, verbs.AccessAll)
	postRecv(t, p.qb, recvWR(1, r1.sge(0, 60), r2.sge(100, 30), r1.sge(128, 128)))
	post(t, p.qa, sendWR(1, gather...))
	wantOK(t, e.wc(p.ca), 1, verbs.WCSend, p.qa)
	if rwc := e.wc(p.cb); rwc.ByteLen != 156 {
		t.Fatalf("receive ByteLen %d, want 156", rwc.ByteLen)
	}
	if got := join(r1.mem[:60], r2.mem[100:130], r1.mem[128:194]); !bytes.Equal(got, want) {
		t.Fatal("SEND gather / receive scatter reordered or lost bytes")
	}

	// WRITE gathers; READ scatters.
	dst := e.b.mr(256, verbs.AccessAll)
	wr := writeWR(2, gather[0], dst, 0)
	wr.SGL = gather
	post(t, p.qa, wr)
	wantOK(t, e.wc(p.ca), 2, verbs.WCWrite, p.qa)
	if !bytes.Equal(dst.mem[:156], want) {
		t.Fatal("WRITE did not gather its SGEs in order")
	}
	l1, l2 := e.a.mr(256, verbs.AccessAll), e.a.mr(256, verbs.AccessAll)
	rd := readWR(3, l1.sge(0, 100), dst, 0)
	rd.SGL = []verbs.SGE{l1.sge(0, 100), l2.sge(50, 56)}
	post(t, p.qa, rd)
	wantOK(t, e.wc(p.ca), 3, verbs.WCRead, p.qa)
	if got := join(l1.mem[:100], l2.mem[50:106]); !bytes.Equal(got, want) {
		t.Fatal("READ did not scatter into its SGEs in order")
	}
}

func join(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// testInline: inline data is copied at post time, so the source needs no
// registration and may be reused as soon as PostSend returns.
func testInline(t *testing.T, e *env) {
	lim := min(64, e.a.dev.Attr().MaxInline)
	p := e.rc(rcOpts{cap: verbs.QPCap{MaxInline: lim}})
	// Off-heap (the SGE names a virtual address), but never registered.
	blk, err := offheap.AllocShared("krcore-conformance-inline", 256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blk.Close() })
	src := blk.Bytes()
	dst, rbuf := e.b.mr(256, verbs.AccessAll), e.b.mr(256, verbs.AccessAll)
	sge := verbs.SGE{Addr: offheap.Addr(src), Length: uint32(lim)}
	sent := pattern(lim, 7)

	copy(src, sent)
	postRecv(t, p.qb, recvWR(1, rbuf.sge(0, 256)))
	post(t, p.qa, verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled | verbs.Inline, SGL: []verbs.SGE{sge}})
	clear(src) // legal: the data was copied at post time
	copy(src, sent)
	post(t, p.qa, verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled | verbs.Inline, SGL: []verbs.SGE{sge}, RemoteAddr: dst.at(0), RKey: dst.RKey()})
	clear(src)
	wantOK(t, e.wc(p.ca), 1, verbs.WCSend, p.qa)
	wantOK(t, e.wc(p.ca), 2, verbs.WCWrite, p.qa)
	if rwc := e.wc(p.cb); rwc.ByteLen != uint32(lim) || !bytes.Equal(rbuf.mem[:lim], sent) {
		t.Fatalf("inline SEND: receive of %d bytes does not hold the data as posted", rwc.ByteLen)
	}
	if !bytes.Equal(dst.mem[:lim], sent) {
		t.Fatal("inline WRITE: target does not hold the data as posted")
	}
}

// testUnsignaled: a successful unsignaled WR leaves no completion; RC
// completes in order, so once the signaled WR after it is polled, the
// absence is certain without waiting.
func testUnsignaled(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	fill(src.mem, 8)
	var wrs []verbs.SendWR
	for i := range 4 {
		wr := writeWR(uint64(i), src.sge(i*16, 16), dst, i*16)
		if i < 3 {
			wr.Flags = 0
		}
		wrs = append(wrs, wr)
	}
	post(t, p.qa, wrs...)
	wantOK(t, e.wc(p.ca), 3, verbs.WCWrite, p.qa)
	empty(t, p.ca)
	if !bytes.Equal(dst.mem, src.mem) {
		t.Fatal("unsignaled WRITEs did not all land")
	}
}

// testSignalAll: a QP created with SignalAll completes every WR.
func testSignalAll(t *testing.T, e *env) {
	p := e.rc(rcOpts{signalAll: true})
	src, dst := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	for i := range 3 {
		wr := writeWR(uint64(i), src.sge(0, 8), dst, 0)
		wr.Flags = 0
		post(t, p.qa, wr)
	}
	for i, wc := range e.wcs(p.ca, 3) {
		wantOK(t, wc, uint64(i), verbs.WCWrite, p.qa)
	}
}

// testFence: a fenced WR waits for the READ before it, so the READ sees
// the memory as it was before the fenced WRITE.
func testFence(t *testing.T, e *env) {
	p := e.rc(rcOpts{})
	local, remote := e.a.mr(64, verbs.AccessAll), e.b.mr(64, verbs.AccessAll)
	fill(remote.mem[:16], 1)
	fill(local.mem[32:48], 2)
	before := bytes.Clone(remote.mem[:16])
	wr := writeWR(2, local.sge(32, 16), remote, 0)
	wr.Flags |= verbs.Fence
	post(t, p.qa, readWR(1, local.sge(0, 16), remote, 0), wr)
	for i, wc := range e.wcs(p.ca, 2) {
		wantOK(t, wc, uint64(i+1), []verbs.WCOpcode{verbs.WCRead, verbs.WCWrite}[i], p.qa)
	}
	if !bytes.Equal(local.mem[:16], before) {
		t.Fatal("READ before a fenced WRITE saw the WRITE's data")
	}
	if !bytes.Equal(remote.mem[:16], local.mem[32:48]) {
		t.Fatal("fenced WRITE did not land")
	}
}

// testLoopback: two QPs on one device connect to each other, as two
// applications on one host do.
func testLoopback(t *testing.T, e *env) {
	cq := e.a.cq(64)
	q1 := e.a.qp(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq})
	q2 := e.a.qp(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq})
	connect(t, q1, q2, verbs.Path{})
	src, dst := e.a.mr(128, verbs.AccessAll), e.a.mr(128, verbs.AccessAll)
	fill(src.mem, 16)
	post(t, q1, writeWR(1, src.sge(0, 64), dst, 0))
	wantOK(t, e.wc(cq), 1, verbs.WCWrite, q1)
	postRecv(t, q1, recvWR(3, dst.sge(64, 64)))
	post(t, q2, sendWR(2, src.sge(64, 64)))
	got := e.wcs(cq, 2)
	if got[0].ID != 2 {
		got[0], got[1] = got[1], got[0]
	}
	wantOK(t, got[0], 2, verbs.WCSend, q2)
	wantOK(t, got[1], 3, verbs.WCRecv, q1)
	if !bytes.Equal(dst.mem, src.mem) {
		t.Fatal("loopback WRITE or SEND did not deliver the data")
	}
}
