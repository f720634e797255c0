package core_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// secretPattern fills memory no request may read or write: an exporter's
// unexported bytes and the guards around the fuzzer's own export.
var secretPattern = []byte("SECRET!!")

// vqFuzz is one run of FuzzVQ: a two-node cluster whose node 2 exports
// "ro", "pub" (the innocents') and "fz" (the fuzzed VQ's read-write
// region, between guards), node 1's innocent VQs doing checked traffic on
// pub, and the fuzzed VQ sharing their DCI.
type vqFuzz struct {
	t       *testing.T
	ctx     context.Context
	a, b    *core.Runtime
	e       *exporter
	guarded krcore.MR // guard | fz | guard on node 2
	regions []fuzzRegion
	q       *core.Queue
	toPort  bool        // q is connected to the receiver's port: SEND allowed
	mrs     []krcore.MR // the fuzzed VQ's MRs, some deregistered
	rq      *core.Queue // node 2's receiver, bound to fuzzPort
	rmrs    []krcore.MR // its receive MRs, some deregistered
	nextID  uint64
	reads   int // READs verified
	// lastPopped is the ID of the fuzzed VQ's last completion: IDs grow in
	// push order, so completions must too.
	lastPopped uint64
}

// fuzzRegion is a region the fuzzed VQ may name and what it may do there:
// legit regions can succeed, within their grant; the rest never.
type fuzzRegion struct {
	name     string
	g        krcore.Region
	legit    bool
	readOnly bool // from ro: a WRITE or atomic never succeeds
}

const (
	fzLen    = 1024
	fuzzPort = 77
)

// FuzzVQ drives a VQ with random requests (every opcode, local and remote
// ranges in and out of bounds, forged, foreign and zero regions, MRs of
// other runtimes and deregistered ones), random deregistrations, unexports
// and VQ Closes, beside innocent VQs doing checked traffic on the same
// shared QP. It fails on a wrong byte anywhere (an innocent's, a secret or
// guard read or changed, a read-only export written), a SUCCESS a grant
// does not allow, a request that does not complete in order, a hang
// (every wait is bounded) or a panic.
func FuzzVQ(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 8, 0, 1, 0, 2, 0, 0, 16, 0, 0})
	f.Add([]byte{1, 0, 1, 1, 0, 8, 2, 1, 3, 1, 0, 3, 2, 0, 0, 0, 1, 2, 0, 0, 8, 0, 1})
	f.Add([]byte{0, 2, 0, 0, 4, 0, 5, 0, 0, 8, 1, 0, 0, 2, 1, 0, 0, 5, 0, 64, 0, 0, 3, 0, 1, 6, 7})
	f.Add([]byte{0, 0, 6, 2, 1, 0, 8, 4, 0, 0, 1, 3, 0, 0, 200, 3, 0, 5, 255, 255, 255, 4, 0, 0, 1, 2, 3})
	f.Add([]byte{1, 5, 0, 0, 0, 0, 0, 4, 3, 3, 3, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 2, 0, 2, 1, 2, 2, 3})
	f.Add([]byte{0, 4, 1, 8, 0, 0, 0, 7, 5, 3, 0, 0, 0, 0, 8, 1, 1, 1, 7, 6, 3, 9, 0, 0, 0, 9, 0, 7, 5, 3, 0, 0, 0, 0, 2, 5, 3, 32, 0, 0, 0})
	f.Add([]byte{1, 4, 1, 8, 0, 2, 0, 8, 0, 0, 0, 0, 5, 3, 31, 0, 0, 0, 9, 0, 7, 5, 3, 0, 0, 0, 0, 4, 0, 3, 1})
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) == 0 {
			return
		}
		m := modeDC
		if prog[0]&1 == 1 {
			m = modeNoDC
		}
		z := newVQFuzz(t, m)
		stop := innocents(t, z.a, z.pubRegion(), z.e, 2, make(chan struct{}))
		z.run(prog[1:])
		z.drain()
		for _, err := range stop() {
			if err != nil {
				t.Error(err)
			}
		}
		z.checkMemory()
	})
}

func newVQFuzz(t *testing.T, m mode) *vqFuzz {
	// A shallow send queue keeps requests waiting on the shared QP behind
	// each other's, where a deregistration or a broken QP would hurt. The
	// transport timeout is generous (1.4 s to RETRY_EXC_ERR): fuzzing runs
	// instrumented, on every core, and a response late by load is not what
	// it looks for; a hang still fails it at the contexts' 10 s.
	path := verbs.Path{Timeout: 200 * time.Millisecond, RetryCount: 7}
	c := m.start(t, 2, core.Config{DCIs: 1, RCPeers: -1, Depth: 8, Credits: 16, Path: path})
	cx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	z := &vqFuzz{t: t, ctx: cx, a: c.Node(1), b: c.Node(2)}
	z.e = newExporter(t, z.b)
	var err error
	if z.guarded, err = z.b.RegMR(3*fzLen, verbs.AccessAll); err != nil {
		t.Fatal(err)
	}
	copy(z.guarded.Bytes(), bytes.Repeat(secretPattern, 3*fzLen/len(secretPattern)))
	clear(z.guarded.Bytes()[fzLen : 2*fzLen])
	if err := z.b.Export("fz", z.guarded, fzLen, fzLen, verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	z.learn()
	for i := 0; i < 3; i++ {
		z.newMR(i)
	}
	if z.rq, err = z.b.Queue(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.rq.Close() })
	if err := z.rq.Bind(fuzzPort); err != nil {
		t.Fatal(err)
	}
	z.newRecvMR()
	z.newQueue(false)
	return z
}

func (z *vqFuzz) newRecvMR() {
	mr, err := z.b.RegMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		z.t.Fatal(err)
	}
	z.rmrs = append(z.rmrs, mr)
}

// learn (re)learns the regions the fuzzed VQ may name.
func (z *vqFuzz) learn() {
	z.t.Helper()
	get := func(rt *core.Runtime, name string) krcore.Region {
		g, err := rt.Region(z.ctx, 2, name)
		if err != nil {
			z.t.Fatalf("region %q: %v", name, err)
		}
		return g
	}
	ro, fz, theirs := get(z.a, "ro"), get(z.a, "fz"), get(z.b, "fz")
	z.regions = []fuzzRegion{
		{"ro", ro, true, true},
		{"fz", fz, true, false},
		{"zero", &core.Region{}, false, false},
		{"another runtime's", theirs, false, false},
		{"caller-made", claimedRegion{2, "fz", 1 << 20, verbs.AccessAll}, false, false},
		{"ro grown", core.Forge(ro, 2*exportLen, 0, 0, nil), true, true},
		{"ro moved back", core.Forge(ro, 0, -exportLen, 0, nil), true, true},
		{"ro with all rights", core.Forge(ro, 0, 0, verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic, nil), true, true},
		{"fz grown both ways", core.Forge(fz, 2*fzLen, -fzLen, 0, nil), true, false},
		{"ro with fz's rkey", core.Forge(ro, 0, 0, verbs.AccessAll, fz), true, true},
	}
}

// pubRegion is the innocents' region, learned by node 1.
func (z *vqFuzz) pubRegion() krcore.Region {
	g, err := z.a.Region(z.ctx, 2, "pub")
	if err != nil {
		z.t.Fatal(err)
	}
	return g
}

func (z *vqFuzz) newMR(i int) {
	access := []verbs.Access{verbs.AccessAll, verbs.AccessLocalWrite, 0}[i%3]
	mr, err := z.a.RegMR(4096, access)
	if err != nil {
		z.t.Fatal(err)
	}
	z.mrs = append(z.mrs, mr)
}

// deregister deregisters m (perhaps again) and registers a new MR.
func (z *vqFuzz) deregister(m krcore.MR) {
	if err := z.a.Deregister(m); err != nil && !errors.Is(err, krcore.ErrClosed) {
		z.t.Fatalf("deregister: %v", err)
	}
	if core.MRUses(m) != 0 {
		z.t.Fatalf("deregister returned with %d uses", core.MRUses(m))
	}
	z.newMR(len(z.mrs))
}

func (z *vqFuzz) newQueue(toPort bool) {
	q, err := z.a.Queue()
	if err != nil {
		z.t.Fatal(err)
	}
	var opts krcore.ConnectOptions
	if toPort {
		opts.Port = fuzzPort
	}
	if err := q.Connect(z.ctx, 2, &opts); err != nil {
		z.t.Fatal(err)
	}
	z.q, z.toPort = q, toPort
	z.t.Cleanup(func() { q.Close() })
}

// run interprets prog, a byte per choice; it stops where prog ends.
func (z *vqFuzz) run(prog []byte) {
	next := func() int {
		if len(prog) == 0 {
			return -1
		}
		b := prog[0]
		prog = prog[1:]
		return int(b)
	}
	arg := func() int { return max(next(), 0) }
	for step := 0; step < 64; step++ {
		switch next() % 10 {
		case -1:
			return
		case 0, 1, 2:
			z.request(arg(), arg(), arg(), arg(), arg(), arg())
		case 3:
			z.deregister(z.mrs[arg()%len(z.mrs)])
		case 4:
			// Its requests in flight finish unseen, perhaps READs into
			// its MRs: fresh ones keep later READs' checks exact (and
			// the deregistrations wait for those requests).
			z.q.Close()
			for _, m := range z.mrs {
				z.deregister(m)
			}
			z.newQueue(arg()%2 == 1)
		case 5:
			z.b.Unexport("ro")
			if err := z.b.Export("ro", z.e.mr, z.e.roOff, exportLen, verbs.AccessRemoteRead); err != nil {
				z.t.Fatal(err)
			}
			if arg()%2 == 0 {
				z.learn() // else keep the revoked grants: REM_ACCESS_ERR
			}
		case 6:
			var out [8]krcore.Completion
			z.q.Pop(out[:])
		case 7:
			z.request(arg(), arg(), arg(), arg(), arg(), arg()|0x80)
		case 8:
			m := z.rmrs[arg()%len(z.rmrs)]
			z.rq.PushRecv(m.Range([]int{0, 64, 4000, -1}[arg()%4], []int{64, 16, 4096, 0}[arg()%4]))
		case 9:
			m := z.rmrs[arg()%len(z.rmrs)]
			if err := z.b.Deregister(m); err != nil && !errors.Is(err, krcore.ErrClosed) {
				z.t.Fatalf("deregister a receive MR: %v", err)
			}
			z.newRecvMR()
			z.popMsgs()
		}
	}
}

var fuzzOps = []verbs.Opcode{verbs.OpRead, verbs.OpWrite, verbs.OpWriteImm, verbs.OpCompareSwap, verbs.OpFetchAdd,
	verbs.OpSend, verbs.OpSendImm, 0, 99}

// request pushes one request built from the choices; with sync (flags's
// high bit) it waits for the request's completion and checks it.
func (z *vqFuzz) request(op, mrSel, loc, reg, roff, flags int) {
	r := krcore.Request{ID: z.nextID, Op: fuzzOps[op%len(fuzzOps)], Unsignaled: flags&1 != 0 && flags&0x80 == 0}
	z.nextID++
	sizes := []int{8, 16, 64, 1024, 4096, 0, 4097, 1 << 30}
	offs := []int{0, 8, 4, 4088, 4096, -8, 1 << 20, 2048}
	var mr krcore.MR
	switch k := mrSel % (len(z.mrs) + 2); k {
	case len(z.mrs):
		mr = z.e.mr // another runtime's
	case len(z.mrs) + 1:
		mr = forgedMR(make([]byte, 4096))
	default:
		mr = z.mrs[k]
	}
	r.Local = krcore.Local{MR: mr, Off: offs[loc%len(offs)], Len: sizes[(loc/len(offs))%len(sizes)]}
	if flags&2 != 0 {
		r.Local.MR = nil
	}
	var fr *fuzzRegion
	if reg%16 < len(z.regions) {
		fr = &z.regions[reg%16]
		r.Remote = fr.g.At([]uint64{0, 8, 4, exportLen - 8, exportLen, 2 * exportLen, 1 << 63, 512}[roff%8])
	}
	r.Compare, r.Swap, r.Imm = uint64(roff), uint64(flags), uint32(roff)
	wait := flags&0x80 != 0
	cx, cancel := context.WithTimeout(z.ctx, 10*time.Second)
	defer cancel()
	n, err := z.q.Push(cx, wait, r)
	switch {
	case err != nil && !errors.Is(err, krcore.ErrNoCredit):
		z.t.Fatalf("push %+v: %v", r, err)
	case n == 0 || !wait || r.Unsignaled:
		return
	}
	for {
		wc := z.pop(cx)
		if wc.ID == r.ID {
			z.checkCompletion(&r, fr, wc)
			return
		}
		if wc.ID > r.ID {
			z.t.Fatalf("completion %+v before request %d's", wc, r.ID)
		}
	}
}

// pop waits for the next completion, which must come within cx and after
// the last one popped.
func (z *vqFuzz) pop(cx context.Context) krcore.Completion {
	z.t.Helper()
	var out [1]krcore.Completion
	for {
		n, err := z.q.PopWait(cx, out[:])
		if err != nil {
			z.t.Fatalf("pop (%d outstanding, %s): %v", z.q.Outstanding(), core.DebugState(z.q), err)
		}
		if n == 1 {
			if out[0].ID < z.lastPopped {
				z.t.Fatalf("completion %d after %d's", out[0].ID, z.lastPopped)
			}
			z.lastPopped = out[0].ID
			return out[0]
		}
	}
}

// checkCompletion holds a completed request to what its grant allows and,
// for a READ, what it read.
func (z *vqFuzz) checkCompletion(r *krcore.Request, fr *fuzzRegion, wc krcore.Completion) {
	if wc.Status != verbs.Success {
		return
	}
	switch {
	case !r.Op.Valid():
		z.t.Fatalf("opcode %d succeeded: %+v", r.Op, wc)
	case r.Op.IsSend() && !z.toPort:
		z.t.Fatalf("%s succeeded on a VQ without a port: %+v", r.Op, wc)
	case r.Op.IsSend():
		return
	}
	switch {
	case fr == nil || !fr.legit:
		z.t.Fatalf("%s on region %v succeeded: %+v", r.Op, fr, wc)
	case fr.readOnly && r.Op != verbs.OpRead && !(r.Op == verbs.OpWrite && r.Local.Len == 0):
		// A zero-length WRITE moves nothing, and an RNIC checks no key
		// for it (rxe: "a zero-byte op is not required to set an addr
		// or rkey"): its success grants nothing.
		z.t.Fatalf("%s on read-only %q succeeded", r.Op, fr.name)
	case r.Local.MR == nil || r.Local.MR.Access()&verbs.AccessLocalWrite == 0 && r.Op == verbs.OpRead:
		z.t.Fatalf("%s into MR %v succeeded", r.Op, r.Local.MR)
	}
	if r.Op != verbs.OpRead {
		return
	}
	got := r.Local.MR.Bytes()[r.Local.Off : r.Local.Off+r.Local.Len]
	if bytes.Contains(got, secretPattern) {
		z.t.Fatalf("READ on %q at %d read a secret", fr.name, r.Remote.Off)
	}
	if fr.readOnly && fr.name == "ro" && int(r.Remote.Off)+len(got) <= exportLen {
		if want := z.e.ro[r.Remote.Off:][:len(got)]; !bytes.Equal(got, want) {
			z.t.Fatalf("READ on ro at %d: wrong bytes", r.Remote.Off)
		}
		z.reads++
	}
}

// popMsgs pops the receiver's messages and checks each fits its buffer
// and carries no secret.
func (z *vqFuzz) popMsgs() {
	var msgs [16]krcore.Message
	for n := z.rq.PopMsgs(msgs[:]); n > 0; n = z.rq.PopMsgs(msgs[:]) {
		for _, m := range msgs[:n] {
			data := m.Data
			if m.Buf != nil {
				if m.Len > m.Buf.Len || m.Data != nil {
					z.t.Fatalf("message of %d bytes in a %d-byte buffer", m.Len, m.Buf.Len)
				}
				data = nil // the buffer's MR may be deregistered by now
			}
			if bytes.Contains(data, secretPattern) {
				z.t.Fatal("a message carries a secret")
			}
		}
	}
}

// drain waits for every request of the fuzzed VQ, within a bound: a last
// signaled READ completes only after every request before it (unsignaled
// successes complete unseen), and then nothing may be outstanding.
func (z *vqFuzz) drain() {
	cx, cancel := context.WithTimeout(z.ctx, 10*time.Second)
	defer cancel()
	z.newMR(0)
	last := krcore.Request{ID: z.nextID, Op: verbs.OpRead, Local: z.mrs[len(z.mrs)-1].Range(0, 64), Remote: z.regions[0].g.At(0)}
	z.nextID++
	if _, err := z.q.Push(cx, true, last); err != nil {
		z.t.Fatalf("drain: push: %v", err)
	}
	for wc := z.pop(cx); wc.ID != last.ID; wc = z.pop(cx) {
	}
	if n := z.q.Outstanding(); n != 0 {
		z.t.Fatalf("drain: %d outstanding after the last completion (%s)", n, core.DebugState(z.q))
	}
	z.popMsgs()
}

// checkMemory: node 2's secret, read-only export and guards are as made.
func (z *vqFuzz) checkMemory() {
	if !bytes.Equal(z.e.secret, bytes.Repeat(secretPattern, exportLen/len(secretPattern))) {
		z.t.Error("the exporter's secret changed")
	}
	for i, b := range z.e.ro {
		if want := byte((exportLen+i)*7 + (exportLen+i)>>8); b != want {
			z.t.Fatalf("read-only export changed at %d", i)
		}
	}
	g := z.guarded.Bytes()
	if !bytes.Equal(g[:fzLen], bytes.Repeat(secretPattern, fzLen/8)) || !bytes.Equal(g[2*fzLen:], bytes.Repeat(secretPattern, fzLen/8)) {
		z.t.Error("a guard around fz changed")
	}
}
