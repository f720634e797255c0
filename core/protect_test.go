package core

import (
	"errors"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// fakeVerbsMR stands behind an MR for the pure checks: only its length
// (MR.n), access and liveness matter to them.
type fakeVerbsMR struct{ verbs.MR }

func TestCheck(t *testing.T) {
	rw := &MR{mr: fakeVerbsMR{}, n: 4096, access: verbs.AccessAll}
	ro := &MR{mr: fakeVerbsMR{}, n: 4096, access: 0}
	dead := &MR{mr: fakeVerbsMR{}, n: 4096, access: verbs.AccessAll}
	dead.dead.Store(true)
	g := &Region{g: &grant{name: "r", len: 1024, addr: 1 << 20, access: verbs.AccessRemoteRead | verbs.AccessRemoteAtomic}}
	lim := limits{maxMsg: 1 << 20}
	ok := krcore.Request{Op: verbs.OpRead, Local: rw.Range(0, 64), Remote: g.At(0)}
	if r := check(&ok, localOf(&ok), grantOf(ok.Remote.Region), false, lim); r != nil {
		t.Fatalf("good READ refused: %v", r)
	}
	cases := []struct {
		name string
		req  krcore.Request
		two  bool
		want verbs.Status
	}{
		{"unknown opcode", krcore.Request{Op: 99}, false, verbs.LocQPOpErr},
		{"local past MR end", krcore.Request{Op: verbs.OpRead, Local: rw.Range(4000, 200), Remote: g.At(0)}, false, verbs.LocProtErr},
		{"negative offset", krcore.Request{Op: verbs.OpWrite, Local: rw.Range(-1, 8), Remote: g.At(0)}, false, verbs.LocLenErr},
		{"READ into read-only MR", krcore.Request{Op: verbs.OpRead, Local: ro.Range(0, 8), Remote: g.At(0)}, false, verbs.LocProtErr},
		{"deregistered MR", krcore.Request{Op: verbs.OpWrite, Local: dead.Range(0, 8), Remote: g.At(0)}, false, verbs.LocProtErr},
		{"no MR", krcore.Request{Op: verbs.OpWrite, Local: krcore.Local{Len: 8}, Remote: g.At(0)}, false, verbs.LocProtErr},
		{"too long", krcore.Request{Op: verbs.OpWrite, Local: krcore.Local{MR: rw, Len: 2 << 20}, Remote: g.At(0)}, false, verbs.LocLenErr},
		{"remote past region", krcore.Request{Op: verbs.OpRead, Local: rw.Range(0, 64), Remote: g.At(1000)}, false, verbs.RemAccessErr},
		{"remote offset overflow", krcore.Request{Op: verbs.OpRead, Local: rw.Range(0, 64), Remote: g.At(^uint64(0))}, false, verbs.RemAccessErr},
		{"WRITE to read-only region", krcore.Request{Op: verbs.OpWrite, Local: rw.Range(0, 8), Remote: g.At(0)}, false, verbs.RemAccessErr},
		{"no region", krcore.Request{Op: verbs.OpRead, Local: rw.Range(0, 8)}, false, verbs.RemInvReqErr},
		{"misaligned atomic", krcore.Request{Op: verbs.OpFetchAdd, Local: rw.Range(0, 8), Remote: g.At(4)}, false, verbs.RemInvReqErr},
		{"atomic of 4 bytes", krcore.Request{Op: verbs.OpFetchAdd, Local: rw.Range(0, 4), Remote: g.At(0)}, false, verbs.LocLenErr},
		{"SEND without a port", krcore.Request{Op: verbs.OpSend, Local: rw.Range(0, 8)}, false, verbs.LocQPOpErr},
		{"WRITE_WITH_IMM without a port", krcore.Request{Op: verbs.OpWriteImm, Local: rw.Range(0, 8), Remote: g.At(0)}, false, verbs.LocQPOpErr},
	}
	for _, c := range cases {
		r := check(&c.req, localOf(&c.req), grantOf(c.req.Remote.Region), c.two, lim)
		if r == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if r.status != c.want || !errors.Is(r, krcore.ErrRefused) || !errors.Is(r, c.want) {
			t.Errorf("%s: refused with %v, want %s", c.name, r, c.want)
		}
	}
	send := krcore.Request{Op: verbs.OpSend, Local: rw.Range(0, 8)}
	if r := check(&send, localOf(&send), grantOf(send.Remote.Region), true, lim); r != nil {
		t.Errorf("SEND on a port refused: %v", r)
	}
}

// FuzzCheck: whatever a request holds, check never panics, and what it lets
// through stays inside the caller's MR and the granted region with the
// access the operation needs.
func FuzzCheck(f *testing.F) {
	f.Add(uint8(verbs.OpRead), 0, 8, uint64(0), uint8(0), true)
	f.Add(uint8(verbs.OpFetchAdd), 8, 8, uint64(4), uint8(1), false)
	f.Add(uint8(verbs.OpSend), -1, 1<<30, uint64(1<<63), uint8(2), true)
	f.Add(uint8(verbs.OpSend), 8, 28, uint64(0), uint8(1), false) // plain's SEND without a port
	f.Fuzz(func(t *testing.T, op uint8, off, n int, roff uint64, which uint8, two bool) {
		mrs := []*MR{{mr: fakeVerbsMR{}, n: 4096, access: verbs.AccessAll}, {mr: fakeVerbsMR{}, n: 4096}, nil}
		g := &Region{g: &grant{name: "r", len: 1024, addr: 1 << 20, access: verbs.AccessRemoteRead | verbs.AccessRemoteAtomic}}
		r := krcore.Request{Op: verbs.Opcode(op), Local: krcore.Local{MR: mrs[int(which)%3], Off: off, Len: n}, Remote: g.At(roff)}
		if which&4 != 0 {
			r.Remote.Region = nil
		}
		lim := limits{maxMsg: 1 << 20}
		sameAsFull(t, &r, lim)
		plainAsFull(t, &r, two, lim)
		if which&8 != 0 { // the fast paths on a writable region and a dead MR too
			w := &Region{g: &grant{name: "w", len: 1024, addr: 1 << 20, access: verbs.AccessRemoteWrite}}
			dead := &MR{mr: fakeVerbsMR{}, n: 4096, access: verbs.AccessAll}
			dead.dead.Store(true)
			v := r
			v.Remote.Region = w
			sameAsFull(t, &v, lim)
			plainAsFull(t, &v, two, lim)
			v.Local.MR = dead
			sameAsFull(t, &v, lim)
			plainAsFull(t, &v, two, lim)
		}
		if check(&r, localOf(&r), grantOf(r.Remote.Region), two, lim) != nil {
			return
		}
		if !r.Op.Valid() {
			t.Fatalf("invalid opcode %d accepted", op)
		}
		if n > 0 && (r.Local.MR == nil || off < 0 || off+n > r.Local.MR.Len()) {
			t.Fatalf("local range [%d,+%d) accepted", off, n)
		}
		if !r.Op.IsSend() && (r.Remote.Region == nil || roff > g.Len() || uint64(max(n, 8)) > g.Len()) {
			t.Fatalf("remote offset %d len %d accepted", roff, n)
		}
		if r.Op == verbs.OpWrite || r.Op == verbs.OpWriteImm {
			t.Fatalf("%s accepted on a read-only region", r.Op)
		}
	})
}

// sameAsFull fails t unless checkLocal and checkRemote, with their fast
// paths, accept r exactly when their full checks (localRefusal,
// remoteRefusal) do.
func sameAsFull(t *testing.T, r *krcore.Request, lim limits) {
	t.Helper()
	m, g := localOf(r), grantOf(r.Remote.Region)
	if fast, full := checkLocal(r, m, lim), localRefusal(r, m, lim); (fast == nil) != (full == nil) {
		t.Fatalf("%s local %+v: checkLocal %v, in full %v", r.Op, r.Local, fast, full)
	}
	if fast, full := checkRemote(r, g), remoteRefusal(r, g); (fast == nil) != (full == nil) {
		t.Fatalf("%s %d B at remote %d: checkRemote %v, in full %v", r.Op, r.Local.Len, r.Remote.Off, fast, full)
	}
}

// plainAsFull fails t if plain lets r through where checkOwner or check
// would not, for a VQ of a runtime connected to the region's node and for
// one of another runtime or connected elsewhere (checkOwner's refusals).
func plainAsFull(t *testing.T, r *krcore.Request, twoSided bool, lim limits) {
	t.Helper()
	m, g := localOf(r), grantOf(r.Remote.Region)
	for _, q := range []*Queue{{peer: &peer{}}, {peer: &peer{node: 2}}, {rt: &Runtime{}, peer: &peer{}}} {
		if !plain(r, m, g, q.rt, q.peer.node, twoSided, lim) {
			continue
		}
		if ref := q.checkOwner(r, m, g); ref != nil {
			t.Fatalf("%s local %+v remote %d: plain true, checkOwner %v", r.Op, r.Local, r.Remote.Off, ref)
		}
		if ref := check(r, m, g, twoSided, lim); ref != nil {
			t.Fatalf("%s local %+v remote %d: plain true, check %v", r.Op, r.Local, r.Remote.Off, ref)
		}
	}
}

// localOf is the MR behind r's local handle, as Queue.accept resolves it
// (without its check of which runtime made it).
func localOf(r *krcore.Request) *MR {
	m, _ := r.Local.MR.(*MR)
	return m
}

// FuzzQuick: once plain has let a request through (vet remembers its
// handles and opcode), quick lets through a request naming the same only
// where checkOwner and check both would, judging the handles as they are
// then, whatever its ranges: nothing into an MR deregistered since, nor
// past a Region written over with a smaller one's value.
func FuzzQuick(f *testing.F) {
	f.Add(uint8(verbs.OpRead), 0, 8, uint64(0), uint8(0), true)
	f.Add(uint8(verbs.OpRead), 4090, 8, uint64(0), uint8(4), true)
	f.Add(uint8(verbs.OpWrite), 0, 8, uint64(1020), uint8(2), true)
	f.Add(uint8(verbs.OpSend), -1, 8, uint64(0), uint8(0), true)
	f.Add(uint8(verbs.OpRead), 0, 8, uint64(100), uint8(8), true)
	f.Add(uint8(verbs.OpRead), 0, 8, uint64(0), uint8(16), true)
	f.Add(uint8(verbs.OpRead), 0, 8, uint64(0), uint8(32), true)
	f.Fuzz(func(t *testing.T, op uint8, off, n int, roff uint64, which uint8, two bool) {
		lim := limits{maxMsg: 1 << 20}
		rt := &Runtime{lim: lim}
		mrs := []*MR{{rt: rt, mr: fakeVerbsMR{}, n: 4096, access: verbs.AccessAll}, {rt: rt, mr: fakeVerbsMR{}, n: 4096}}
		access := verbs.AccessRemoteRead
		if which&2 != 0 {
			access = verbs.AccessRemoteWrite
		}
		g := &Region{g: &grant{rt: rt, name: "r", len: 1024, addr: 1 << 20, access: access}}
		m := mrs[which&1]
		q := &Queue{rt: rt, peer: &peer{}, toPort: two}
		good := krcore.Request{Op: verbs.Opcode(op), Local: krcore.Local{MR: m, Len: 8}, Remote: g.At(0)}
		if _, _, ref := q.vet(&good); ref != nil {
			return
		}
		r := good
		r.Local.Off, r.Local.Len, r.Remote.Off = off, n, roff
		if which&4 != 0 {
			m.dead.Store(true)
		}
		if which&8 != 0 {
			*g = Region{g: &grant{rt: rt, name: "s", len: 16, addr: 1 << 21, access: access}}
		}
		if which&16 != 0 { // written over with another runtime's MR
			*m = MR{rt: &Runtime{lim: lim}, mr: fakeVerbsMR{}, n: 4096, access: verbs.AccessAll}
		}
		if which&32 != 0 { // with one without LOCAL_WRITE
			*m = MR{rt: rt, mr: fakeVerbsMR{}, n: 4096}
		}
		qm, qg, ok := q.quick(&r)
		if !ok {
			return
		}
		if m.dead.Load() {
			t.Fatalf("%s into a deregistered MR let through", r.Op)
		}
		if qm != q.rt.ownMR(r.Local.MR) || qg != grantOf(r.Remote.Region) {
			t.Fatalf("%s: quick resolved the handles to %p %p, the full checks to %p %p", r.Op, qm, qg, q.rt.ownMR(r.Local.MR), grantOf(r.Remote.Region))
		}
		if ref := q.checkOwner(&r, qm, qg); ref != nil {
			t.Fatalf("%s local %+v remote %d: quick true, checkOwner %v", r.Op, r.Local, r.Remote.Off, ref)
		}
		if ref := check(&r, qm, qg, two, lim); ref != nil {
			t.Fatalf("%s local %+v remote %d: quick true, check %v", r.Op, r.Local, r.Remote.Off, ref)
		}
	})
}
