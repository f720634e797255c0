package conformance

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// env is the pair of devices one test runs on.
type env struct {
	t    *testing.T
	o    Options
	a, b *node
}

// node is one device of the pair with a protection domain to build on.
type node struct {
	t    *testing.T
	name string
	dev  verbs.Device
	pd   verbs.PD
}

func newEnv(t *testing.T, f Factory, o Options) *env {
	a, b := f(t)
	if a == nil || b == nil {
		t.Fatal("factory returned a nil device")
	}
	closeLater(t, "device a", a)
	closeLater(t, "device b", b)
	return &env{t: t, o: o, a: newNode(t, "a", a), b: newNode(t, "b", b)}
}

func newNode(t *testing.T, name string, dev verbs.Device) *node {
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatalf("device %s: AllocPD: %v", name, err)
	}
	closeLater(t, "PD on "+name, pd)
	return &node{t: t, name: name, dev: dev, pd: pd}
}

// closeLater closes c when the test ends. Tests close some objects
// themselves, so ErrClosed from a second Close is fine; anything else is a
// provider failure worth reporting.
func closeLater(t testing.TB, what string, c io.Closer) {
	t.Cleanup(func() {
		if err := c.Close(); err != nil && !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("close %s at test end: %v", what, err)
		}
	})
}

// alloc returns size bytes of shared off-heap memory, freed at test end.
// Shared (memfd) memory is what a cross-process provider can map into its
// helper process, so the suite uses it everywhere.
func alloc(t testing.TB, size int) []byte {
	t.Helper()
	blk, err := offheap.AllocShared("krcore-conformance", size)
	if err != nil {
		t.Fatalf("offheap.AllocShared(%d): %v", size, err)
	}
	t.Cleanup(func() {
		// Cleanups run last-in first-out, so every MR over the block is
		// closed by now: a pin left behind is a provider leak.
		if err := blk.Close(); err != nil {
			t.Errorf("free off-heap block after its MRs were closed: %v", err)
		}
	})
	return blk.Bytes()
}

// region is a registered buffer: the MR and the memory as this process
// sees it.
type region struct {
	verbs.MR
	mem []byte
}

// sge is the SGE for n bytes at offset off of r.
func (r region) sge(off, n int) verbs.SGE { return verbs.SGEOf(r.MR, off, n) }

// at is the address of offset off of r, as SGEs and remote ops name it.
func (r region) at(off int) uint64 { return r.Addr() + uint64(off) }

// u64 reads the native-endian uint64 at offset off, as atomics see it.
func (r region) u64(off int) uint64 { return binary.NativeEndian.Uint64(r.mem[off:]) }

// setU64 writes the native-endian uint64 at offset off.
func (r region) setU64(off int, v uint64) { binary.NativeEndian.PutUint64(r.mem[off:], v) }

// mr registers size fresh bytes of off-heap memory with access.
func (n *node) mr(size int, access verbs.Access) region {
	n.t.Helper()
	mem := alloc(n.t, size)
	mr, err := n.pd.RegMR(mem, access)
	if err != nil {
		n.t.Fatalf("device %s: RegMR(%d bytes, %s): %v", n.name, size, access, err)
	}
	closeLater(n.t, "MR on "+n.name, mr)
	return region{MR: mr, mem: mem}
}

// cq creates a completion queue of at least cqe entries.
func (n *node) cq(cqe int) verbs.CQ {
	n.t.Helper()
	cq, err := n.dev.CreateCQ(cqe)
	if err != nil {
		n.t.Fatalf("device %s: CreateCQ(%d): %v", n.name, cqe, err)
	}
	closeLater(n.t, "CQ on "+n.name, cq)
	return cq
}

// qp creates a QP; zero Cap fields take defaultCap's values.
func (n *node) qp(init verbs.QPInit) verbs.QP {
	n.t.Helper()
	init.Cap = fillCap(init.Cap, n.defaultCap())
	qp, err := n.pd.CreateQP(init)
	if err != nil {
		n.t.Fatalf("device %s: CreateQP(%s, %+v): %v", n.name, init.Type, init.Cap, err)
	}
	closeLater(n.t, fmt.Sprintf("%s QP on %s", init.Type, n.name), qp)
	return qp
}

// srq creates a shared receive queue.
func (n *node) srq(maxWR int) verbs.SRQ {
	n.t.Helper()
	srq, err := n.pd.CreateSRQ(verbs.SRQInit{MaxWR: maxWR, MaxSGE: min(4, n.dev.Attr().MaxSGE)})
	if err != nil {
		n.t.Fatalf("device %s: CreateSRQ(%d): %v", n.name, maxWR, err)
	}
	closeLater(n.t, "SRQ on "+n.name, srq)
	return srq
}

// ah creates an address handle for the port of dest.
func (n *node) ah(dest verbs.Endpoint) verbs.AH {
	n.t.Helper()
	ah, err := n.pd.CreateAH(verbs.AHAttr{Dest: dest})
	if err != nil {
		n.t.Fatalf("device %s: CreateAH(%v): %v", n.name, dest, err)
	}
	closeLater(n.t, "AH on "+n.name, ah)
	return ah
}

// defaultCap sizes a QP comfortably within the device's limits.
func (n *node) defaultCap() verbs.QPCap {
	at := n.dev.Attr()
	return verbs.QPCap{
		MaxSendWR:  min(64, at.MaxQPWR),
		MaxRecvWR:  min(64, at.MaxQPWR),
		MaxSendSGE: min(4, at.MaxSGE),
		MaxRecvSGE: min(4, at.MaxSGE),
		MaxInline:  min(64, at.MaxInline),
	}
}

func fillCap(c, def verbs.QPCap) verbs.QPCap {
	pick := func(v, d int) int {
		if v == 0 {
			return d
		}
		return v
	}
	return verbs.QPCap{
		MaxSendWR:  pick(c.MaxSendWR, def.MaxSendWR),
		MaxRecvWR:  pick(c.MaxRecvWR, def.MaxRecvWR),
		MaxSendSGE: pick(c.MaxSendSGE, def.MaxSendSGE),
		MaxRecvSGE: pick(c.MaxRecvSGE, def.MaxRecvSGE),
		MaxInline:  pick(c.MaxInline, def.MaxInline),
	}
}

// rcPair is an RC QP on a connected to one on b, each with one CQ for
// sends and receives.
type rcPair struct {
	qa, qb verbs.QP
	ca, cb verbs.CQ
}

// rcOpts shape an rcPair; the zero value is a default connection.
type rcOpts struct {
	cap       verbs.QPCap // zero fields take defaults
	signalAll bool
	path      verbs.Path // applied to both sides
	srqB      verbs.SRQ  // receives of b's QP, if set
	cb        verbs.CQ   // b's CQ, if shared with other pairs
}

// patientPath is the path of a test of something other than timeouts: its
// retry budget (Timeout*(RetryCount+1), 4 s on the soft RNIC) outlasts a
// stall of a loaded machine, where the provider's own may not (the soft
// suites' is 200 ms, to keep the link-death tests short), and ends before
// the default Options.Timeout a test waits for a completion.
var patientPath = verbs.Path{Timeout: time.Second, RetryCount: 3}

// rc creates and connects an RC pair between a and b.
func (e *env) rc(o rcOpts) *rcPair {
	e.t.Helper()
	p := &rcPair{ca: e.a.cq(256), cb: o.cb}
	if p.cb == nil {
		p.cb = e.b.cq(256)
	}
	p.qa = e.a.qp(verbs.QPInit{Type: verbs.RC, SendCQ: p.ca, RecvCQ: p.ca, Cap: o.cap, SignalAll: o.signalAll})
	p.qb = e.b.qp(verbs.QPInit{Type: verbs.RC, SendCQ: p.cb, RecvCQ: p.cb, Cap: o.cap, SignalAll: o.signalAll, SRQ: o.srqB})
	connect(e.t, p.qa, p.qb, o.path)
	return p
}

// connect brings two RC (or UC) QPs to RTS, each aimed at the other.
func connect(t testing.TB, qa, qb verbs.QP, path verbs.Path) {
	t.Helper()
	ea, eb := qa.Endpoint(), qb.Endpoint()
	if err := verbs.Connect(qa, eb, path); err != nil {
		t.Fatalf("connect a: %v", err)
	}
	if err := verbs.Connect(qb, ea, path); err != nil {
		t.Fatalf("connect b: %v", err)
	}
}

// ready brings a UD QP or DCI to RTS, or a DCT to RTR.
func ready(t testing.TB, qp verbs.QP, path verbs.Path) {
	t.Helper()
	if err := verbs.Ready(qp, path); err != nil {
		t.Fatalf("ready: %v", err)
	}
}

// post posts wrs and fails the test unless all are accepted.
func post(t testing.TB, qp verbs.QP, wrs ...verbs.SendWR) {
	t.Helper()
	if n, err := qp.PostSend(wrs); err != nil || n != len(wrs) {
		t.Fatalf("PostSend of %d WRs on %s QP %d (%s): accepted %d: %v", len(wrs), qp.Type(), qp.Num(), qp.State(), n, err)
	}
}

// recvPoster is a QP's or SRQ's receive side.
type recvPoster interface {
	PostRecv(wr []verbs.RecvWR) (int, error)
}

// postRecv posts receives and fails the test unless all are accepted.
func postRecv(t testing.TB, q recvPoster, wrs ...verbs.RecvWR) {
	t.Helper()
	if n, err := q.PostRecv(wrs); err != nil || n != len(wrs) {
		t.Fatalf("PostRecv of %d WRs: accepted %d: %v", len(wrs), n, err)
	}
}

// spinPolls is how many empty polls collect makes before it sleeps in
// Wait: enough to catch a completion that is microseconds away without
// burning a core on a 2-core machine.
const spinPolls = 64

// collect returns exactly n completions from cq, polling no further, or an
// error (with what arrived) when Poll fails or the deadline passes.
func collect(cq verbs.CQ, n int, d time.Duration) ([]verbs.WC, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return collectCtx(ctx, cq, n)
}

func collectCtx(ctx context.Context, cq verbs.CQ, n int) ([]verbs.WC, error) {
	out := make([]verbs.WC, 0, n)
	buf := make([]verbs.WC, 32)
	for len(out) < n {
		k, err := pollSome(ctx, cq, buf[:min(len(buf), n-len(out))])
		out = append(out, buf[:k]...)
		if err != nil {
			return out, fmt.Errorf("after %d of %d completions: %w", len(out), n, err)
		}
	}
	return out, nil
}

// pollSome fills buf with at least one completion: it spins a little,
// then sleeps in Wait until ctx ends.
func pollSome(ctx context.Context, cq verbs.CQ, buf []verbs.WC) (int, error) {
	for idle := 0; ; idle++ {
		k, err := cq.Poll(buf)
		if err != nil {
			return k, fmt.Errorf("poll: %w", err)
		}
		if k > 0 {
			return k, nil
		}
		if idle < spinPolls {
			runtime.Gosched()
			continue
		}
		if err := cq.Wait(ctx); err != nil {
			return 0, fmt.Errorf("wait: %w", err)
		}
	}
}

// wcs collects n completions within the suite's timeout or fails the test.
func (e *env) wcs(cq verbs.CQ, n int) []verbs.WC {
	e.t.Helper()
	return e.wcsWithin(cq, n, e.o.timeout())
}

func (e *env) wcsWithin(cq verbs.CQ, n int, d time.Duration) []verbs.WC {
	e.t.Helper()
	got, err := collect(cq, n, d)
	if err != nil {
		e.t.Fatalf("%v; got %s", err, describe(got))
	}
	return got
}

// wc collects one completion.
func (e *env) wc(cq verbs.CQ) verbs.WC {
	e.t.Helper()
	return e.wcs(cq, 1)[0]
}

// none checks that no completion arrives on cq within d. It is used only
// where absence is the behaviour under test, after a positive barrier
// where one exists, so d can stay short.
func (e *env) none(cq verbs.CQ, d time.Duration) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	buf := make([]verbs.WC, 8)
	for {
		n, err := cq.Poll(buf)
		if err != nil {
			e.t.Fatalf("poll: %v", err)
		}
		if n > 0 {
			e.t.Fatalf("unexpected completions %s", describe(buf[:n]))
		}
		if err := cq.Wait(ctx); err != nil {
			if ctx.Err() == nil {
				e.t.Fatalf("wait: %v", err)
			}
			return
		}
	}
}

// eventually waits until cond holds, for conditions no completion or
// channel reports (memory written by a peer, a QP's state). It checks
// often but sleeps between checks, so it costs no core.
func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(e.o.timeout())
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// empty checks that cq holds no completion right now.
func empty(t testing.TB, cq verbs.CQ) {
	t.Helper()
	buf := make([]verbs.WC, 8)
	n, err := cq.Poll(buf)
	if err != nil {
		t.Fatalf("poll: %v", err)
	}
	if n > 0 {
		t.Fatalf("unexpected completions %s", describe(buf[:n]))
	}
}

// wantOK checks a successful completion of WR id with opcode op on qp.
func wantOK(t testing.TB, wc verbs.WC, id uint64, op verbs.WCOpcode, qp verbs.QP) {
	t.Helper()
	if wc.Status != verbs.Success || wc.Err() != nil {
		t.Fatalf("WR %d: status %s (err %v), want SUCCESS", wc.ID, wc.Status, wc.Err())
	}
	if wc.ID != id || wc.Op != op || wc.QPN != qp.Num() {
		t.Fatalf("completion {id %d op %s qpn %d}, want {id %d op %s qpn %d}", wc.ID, wc.Op, wc.QPN, id, op, qp.Num())
	}
}

// wantStatus checks a failed completion of WR id, through errors.Is as
// callers will test it.
func wantStatus(t testing.TB, wc verbs.WC, id uint64, st verbs.Status) {
	t.Helper()
	if wc.ID != id || wc.Status != st {
		t.Fatalf("completion {id %d %s}, want {id %d %s}", wc.ID, wc.Status, id, st)
	}
	err := wc.Err()
	if !errors.Is(err, st) {
		t.Fatalf("WR %d: errors.Is(wc.Err() = %v, %s) is false", id, err, st)
	}
	var ce *verbs.CompletionError
	if !errors.As(err, &ce) || ce.ID != id {
		t.Fatalf("WR %d: wc.Err() = %#v, want a *verbs.CompletionError for that WR", id, err)
	}
}

// wantState checks a QP's state.
func wantState(t testing.TB, qp verbs.QP, st verbs.QPState) {
	t.Helper()
	if got := qp.State(); got != st {
		t.Fatalf("%s QP %d is in %s, want %s", qp.Type(), qp.Num(), got, st)
	}
}

// fill writes a recognisable pattern derived from seed.
func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
}

// pattern returns n bytes of fill's pattern.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	fill(b, seed)
	return b
}

// Work request builders. Each is signaled: tests that need unsignaled
// WRs clear the flag.

func writeWR(id uint64, src verbs.SGE, dst region, off int) verbs.SendWR {
	return verbs.SendWR{ID: id, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{src}, RemoteAddr: dst.at(off), RKey: dst.RKey()}
}

func readWR(id uint64, dst verbs.SGE, src region, off int) verbs.SendWR {
	return verbs.SendWR{ID: id, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{dst}, RemoteAddr: src.at(off), RKey: src.RKey()}
}

func faaWR(id uint64, result verbs.SGE, target region, off int, add uint64) verbs.SendWR {
	return verbs.SendWR{ID: id, Op: verbs.OpFetchAdd, Flags: verbs.Signaled, SGL: []verbs.SGE{result}, RemoteAddr: target.at(off), RKey: target.RKey(), CompareAdd: add}
}

func casWR(id uint64, result verbs.SGE, target region, off int, cmp, swap uint64) verbs.SendWR {
	return verbs.SendWR{ID: id, Op: verbs.OpCompareSwap, Flags: verbs.Signaled, SGL: []verbs.SGE{result}, RemoteAddr: target.at(off), RKey: target.RKey(), CompareAdd: cmp, Swap: swap}
}

func sendWR(id uint64, sgl ...verbs.SGE) verbs.SendWR {
	return verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: sgl}
}

func recvWR(id uint64, sgl ...verbs.SGE) verbs.RecvWR {
	return verbs.RecvWR{ID: id, SGL: sgl}
}
