package core_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// exporter is a node's MR with three parts: a secret it never exports, a
// read-only export "ro" and a public read-write export "pub".
type exporter struct {
	mr               krcore.MR
	secret, ro, pub  []byte // views of mr's bytes
	roOff, pubOff, n int
}

const exportLen = 1024

func newExporter(t testing.TB, rt *core.Runtime) *exporter {
	t.Helper()
	mr, err := rt.RegMR(3*exportLen, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	b := mr.Bytes()
	e := &exporter{mr: mr, secret: b[:exportLen], ro: b[exportLen : 2*exportLen], pub: b[2*exportLen:], roOff: exportLen, pubOff: 2 * exportLen, n: exportLen}
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	copy(e.secret, bytes.Repeat([]byte("SECRET!!"), exportLen/8))
	if err := rt.Export("ro", mr, e.roOff, exportLen, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if err := rt.Export("pub", mr, e.pubOff, exportLen, verbs.AccessRemoteRead|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	return e
}

// snapshot copies the exporter's secret and read-only bytes.
func (e *exporter) snapshot() []byte { return append(append([]byte(nil), e.secret...), e.ro...) }

// innocents runs k VQs on rt doing checked traffic on region pub (of
// node 2) until stop: each WRITEs its own 64-byte slot and READs it back,
// and READs the exporter's fixed tail. Every wrong byte or failed request
// is an error on errs.
func innocents(t *testing.T, rt *core.Runtime, pub krcore.Region, e *exporter, k int, stop chan struct{}) func() []error {
	var wg sync.WaitGroup
	errs := make([]error, k)
	for v := 0; v < k; v++ {
		wg.Add(1)
		go func(v int) {
			defer wg.Done()
			errs[v] = innocent(t, rt, pub, e, v, stop)
		}(v)
	}
	return func() []error { close(stop); wg.Wait(); return errs }
}

func innocent(t *testing.T, rt *core.Runtime, pub krcore.Region, e *exporter, v int, stop chan struct{}) error {
	c := ctx(t)
	q, err := rt.Queue()
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.Connect(c, pub.Node(), nil); err != nil {
		return err
	}
	mine, _ := rt.RegMR(256, verbs.AccessAll)
	defer rt.Deregister(mine)
	slot := uint64(v * 64)
	tail := e.pub[512:576]
	var out [1]krcore.Completion
	do := func(r krcore.Request) error {
		if _, err := q.Push(c, true, r); err != nil {
			return err
		}
		if _, err := q.PopWait(c, out[:]); err != nil {
			return err
		}
		if out[0].Status != verbs.Success {
			return fmt.Errorf("innocent VQ %d: %+v", v, out[0])
		}
		return nil
	}
	for i := 0; ; i++ {
		select {
		case <-stop:
			if i >= 20 { // some rounds overlap whatever the test does meanwhile
				return nil
			}
		default:
		}
		w := mine.Bytes()[:64]
		for j := range w {
			w[j] = byte(v + i + j)
		}
		clear(mine.Bytes()[64:192])
		if err := do(krcore.Request{ID: 1, Op: verbs.OpWrite, Local: mine.Range(0, 64), Remote: pub.At(slot)}); err != nil {
			return err
		}
		if err := do(krcore.Request{ID: 2, Op: verbs.OpRead, Local: mine.Range(64, 64), Remote: pub.At(slot)}); err != nil {
			return err
		}
		if err := do(krcore.Request{ID: 3, Op: verbs.OpRead, Local: mine.Range(128, 64), Remote: pub.At(512)}); err != nil {
			return err
		}
		if b := mine.Bytes(); !bytes.Equal(b[64:128], w) || !bytes.Equal(b[128:192], tail) {
			return fmt.Errorf("innocent VQ %d round %d: wrong bytes", v, i)
		}
	}
}

// TestRegionForgery: a Region the runtime did not hand out (zero value,
// another runtime's, a daemon client's handle claiming more) never reaches
// the shared QP, and the exporter's secret and read-only bytes stay
// unread and untouched, while innocent VQs on the same DCI see every
// byte right.
func TestRegionForgery(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 3, core.Config{DCIs: 1, RCPeers: -1})
		a, b, third := c.Node(1), c.Node(2), c.Node(3)
		e := newExporter(t, b)
		before := e.snapshot()
		ro, err := a.Region(ctx(t), 2, "ro")
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := a.Region(ctx(t), 2, "pub")
		if ro.Node() != 2 || ro.Name() != "ro" || ro.Len() != exportLen || ro.Access() != verbs.AccessRemoteRead {
			t.Fatalf("region ro: node %d name %q len %d access %s", ro.Node(), ro.Name(), ro.Len(), ro.Access())
		}
		theirs, err := third.Region(ctx(t), 2, "pub")
		if err != nil {
			t.Fatal(err)
		}
		stop := innocents(t, a, pub, e, 4, make(chan struct{}))
		q := mustQueue(t, a, 2)
		local, _ := a.RegMR(4096, verbs.AccessAll)
		copied := *ro
		forged := []struct {
			name string
			g    krcore.Region
			want verbs.Status
		}{
			{"zero value", &core.Region{}, verbs.RemInvReqErr},
			{"another runtime's", theirs, verbs.RemAccessErr},
			{"caller-made claiming all", claimedRegion{2, "ro", 3 * exportLen, verbs.AccessAll}, verbs.RemInvReqErr},
		}
		id := uint64(0)
		for _, f := range forged {
			for _, op := range []verbs.Opcode{verbs.OpRead, verbs.OpWrite, verbs.OpFetchAdd} {
				for _, off := range []uint64{0, exportLen - 8, exportLen, 2 * exportLen} {
					id++
					clear(local.Bytes())
					q.Push(ctx(t), true, krcore.Request{ID: id, Op: op, Local: local.Range(0, 8), Remote: f.g.At(off)})
					if wc := pop1(t, q); wc.ID != id || wc.Status != f.want {
						t.Errorf("%s: %s at %d: %+v, want %s", f.name, op, off, wc, f.want)
					}
					if !bytes.Equal(local.Bytes(), make([]byte, 4096)) {
						t.Errorf("%s: %s at %d: bytes landed", f.name, op, off)
					}
				}
			}
		}
		// A copy is the same grant: within it, it works; past it, refused.
		q.Push(ctx(t), true, krcore.Request{ID: 100, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: copied.At(exportLen - 8)})
		if wc := pop1(t, q); wc.Status != verbs.Success || !bytes.Equal(local.Bytes()[:8], e.ro[exportLen-8:]) {
			t.Errorf("copy of a region, in bounds: %+v", wc)
		}
		for _, r := range []krcore.Request{
			{ID: 101, Op: verbs.OpRead, Local: local.Range(0, 16), Remote: copied.At(exportLen - 8)},
			{ID: 102, Op: verbs.OpWrite, Local: local.Range(0, 8), Remote: copied.At(0)},
		} {
			q.Push(ctx(t), true, r)
			if wc := pop1(t, q); !errors.Is(wc.Err(), verbs.RemAccessErr) {
				t.Errorf("copy of a region, %s past its grant: %+v", r.Op, wc)
			}
		}
		for _, err := range stop() {
			if err != nil {
				t.Error(err)
			}
		}
		if !bytes.Equal(e.snapshot(), before) {
			t.Error("the exporter's secret or read-only bytes changed")
		}
		if st := a.Stats(); st.Recoveries != 0 {
			t.Errorf("refusals reached the shared QP: %d recoveries", st.Recoveries)
		}
	}, modeDC, modeNoDC)
}

// TestExportEnforcedAtResponder: a Region record edited past its grant
// (grown, moved, with rights added, with another export's rkey) that gets
// by the requester's checks is refused by the exporter's RNIC with
// REM_ACCESS_ERR: the export is its own registration of exactly its bytes
// and rights. The secret and read-only bytes stay unread and untouched,
// and innocent VQs on the same shared DCI get every byte right.
func TestExportEnforcedAtResponder(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		// patientPath: the refusals come from the exporter at once; a
		// starved responder timing out a request (RETRY_EXC_ERR) marks
		// node 2 dead and fails every case after it.
		c := m.start(t, 2, core.Config{DCIs: 1, RCPeers: -1, Path: patientPath})
		a, b := c.Node(1), c.Node(2)
		e := newExporter(t, b)
		before := e.snapshot()
		ro, _ := a.Region(ctx(t), 2, "ro")
		pub, err := a.Region(ctx(t), 2, "pub")
		if err != nil {
			t.Fatal(err)
		}
		stop := innocents(t, a, pub, e, 4, make(chan struct{}))
		q := mustQueue(t, a, 2)
		local, _ := a.RegMR(4096, verbs.AccessAll)
		cases := []struct {
			name string
			g    krcore.Region
			op   verbs.Opcode
			off  uint64
		}{
			{"grown: READ past the end", core.Forge(ro, exportLen, 0, 0, nil), verbs.OpRead, exportLen},
			{"grown: READ across the end", core.Forge(ro, exportLen, 0, 0, nil), verbs.OpRead, exportLen - 8},
			{"moved onto the secret", core.Forge(ro, 0, -exportLen, 0, nil), verbs.OpRead, 0},
			{"write added", core.Forge(ro, 0, 0, verbs.AccessRemoteWrite, nil), verbs.OpWrite, 0},
			{"atomic added", core.Forge(ro, 0, 0, verbs.AccessRemoteAtomic, nil), verbs.OpFetchAdd, 8},
			{"pub's rkey on ro's bytes", core.Forge(ro, 0, 0, verbs.AccessRemoteWrite, pub), verbs.OpWrite, 0},
			{"pub's rkey on the secret", core.Forge(ro, 0, -exportLen, verbs.AccessRemoteWrite, pub), verbs.OpRead, 0},
		}
		for i, cs := range cases {
			clear(local.Bytes())
			copy(local.Bytes(), "CLOBBER!CLOBBER!")
			n := 16
			if cs.op.IsAtomic() {
				n = 8
			}
			q.Push(ctx(t), true, krcore.Request{ID: uint64(i), Op: cs.op, Local: local.Range(0, n), Remote: cs.g.At(cs.off)})
			if wc := pop1(t, q); wc.Status != verbs.RemAccessErr {
				t.Errorf("%s: %+v, want REM_ACCESS_ERR", cs.name, wc)
			}
			if !bytes.Equal(local.Bytes()[16:], make([]byte, 4096-16)) || string(local.Bytes()[:16]) != "CLOBBER!CLOBBER!" {
				t.Errorf("%s: bytes landed: %q", cs.name, local.Bytes()[:16])
			}
		}
		for _, err := range stop() {
			if err != nil {
				t.Error(err)
			}
		}
		if !bytes.Equal(e.snapshot(), before) {
			t.Error("the exporter's secret or read-only bytes changed")
		}
		q.Push(ctx(t), true, krcore.Request{ID: 99, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: ro.At(0)})
		if wc := pop1(t, q); wc.Status != verbs.Success || !bytes.Equal(local.Bytes()[:8], e.ro[:8]) {
			t.Errorf("the real grant after the forgeries: %+v", wc)
		}
	}, modeDC, modeNoDC)
}

// TestAudience: a region exported to a principal (a node and a port) is
// found only by a queue of that node holding that port: the node's
// unbound queue, its runtime asking as no port, its queue bound to
// another port, and a queue of another node bound to the same port all
// get ErrNoRegion, as for a name never exported; the principal reads it.
// An everyone-export stays visible to all of them.
func TestAudience(t *testing.T) {
	c := start(t, 3, core.Config{})
	owner, a, b := c.Node(1), c.Node(2), c.Node(3)
	mr := serve(t, owner, "open", 64)
	copy(mr.Bytes(), "for node 2 port 9")
	if err := owner.Export("closed", mr, 0, 64, verbs.AccessRemoteRead, krcore.Principal{Node: 2, Port: 9}); err != nil {
		t.Fatal(err)
	}
	bound := func(rt *core.Runtime, port uint32) *core.Queue {
		q := mustQueue(t, rt, 1)
		if port != 0 {
			if err := q.Bind(port); err != nil {
				t.Fatal(err)
			}
		}
		return q
	}
	for _, o := range []struct {
		what string
		q    *core.Queue
	}{{"node 2 unbound", bound(a, 0)}, {"node 2 port 10", bound(a, 10)}, {"node 3 port 9", bound(b, 9)}} {
		if _, err := o.q.Region(ctx(t), "closed"); !errors.Is(err, krcore.ErrNoRegion) {
			t.Errorf("%s found the region exported to node 2 port 9: %v", o.what, err)
		}
		if _, err := o.q.Region(ctx(t), "open"); err != nil {
			t.Errorf("%s: everyone-export: %v", o.what, err)
		}
	}
	if _, err := a.Region(ctx(t), 1, "closed"); !errors.Is(err, krcore.ErrNoRegion) {
		t.Errorf("node 2's runtime asking as no port found it: %v", err)
	}
	q := bound(a, 9)
	g, err := q.Region(ctx(t), "closed")
	if err != nil {
		t.Fatalf("the principal: %v", err)
	}
	local, _ := a.RegMR(64, verbs.AccessAll)
	q.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: local.Range(0, 17), Remote: g.At(0)})
	if wc := pop1(t, q); wc.Err() != nil || string(local.Bytes()[:17]) != "for node 2 port 9" {
		t.Fatalf("the principal's READ: %v %q", wc.Err(), local.Bytes()[:17])
	}
	q.Unbind() // the port no longer vouched for
	if _, err := q.Region(ctx(t), "closed"); !errors.Is(err, krcore.ErrNoRegion) {
		t.Errorf("found after Unbind: %v", err)
	}
	for _, to := range [][]krcore.Principal{{{Node: 0, Port: 9}}, {{Node: 2, Port: 0}}, {{Node: 2, Port: 1 << 31}}} {
		if err := owner.Export("bad", mr, 0, 8, verbs.AccessRemoteRead, to...); !errors.Is(err, krcore.ErrInvalid) {
			t.Errorf("export to %v: %v, want ErrInvalid", to, err)
		}
	}
	if err := owner.Export("big", mr, 0, 8, verbs.AccessRemoteRead, make([]krcore.Principal, krcore.MaxAudience+1)...); !errors.Is(err, krcore.ErrLimit) {
		t.Errorf("export to %d principals: %v, want ErrLimit", krcore.MaxAudience+1, err)
	}
}
