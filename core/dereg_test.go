package core_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestDeregisterInFlight: an MR deregistered while its requests sit on a
// shared DCI behind other VQs' requests is not pulled from under them: they
// complete SUCCESS with their bytes, the QP never breaks, innocent VQs on
// it see every byte right, the MR is refused at once to new requests, and
// Deregister returns only once the memory is released.
func TestDeregisterInFlight(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		// A shallow send queue keeps most of the victim's requests waiting
		// on the QP behind the innocents'.
		c := m.start(t, 2, core.Config{DCIs: 1, RCPeers: -1, Depth: 4})
		a, b := c.Node(1), c.Node(2)
		e := newExporter(t, b)
		pub, err := a.Region(ctx(t), 2, "pub")
		if err != nil {
			t.Fatal(err)
		}
		stop := innocents(t, a, pub, e, 4, make(chan struct{}))
		victim := mustQueue(t, a, 2)
		for round := 0; round < 20; round++ {
			doomed, _ := a.RegMR(64*exportLen, verbs.AccessAll)
			const k = 48
			reqs := make([]krcore.Request, k)
			for i := range reqs {
				reqs[i] = krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: doomed.Range(i*exportLen, exportLen), Remote: pub.At(0)}
				if i%2 == 1 { // a WRITE of what the innocents' READs expect
					reqs[i] = krcore.Request{ID: uint64(i), Op: verbs.OpWrite, Local: doomed.Range(i*exportLen, 64), Remote: pub.At(512)}
					copy(doomed.Bytes()[i*exportLen:], e.pub[512:576])
				}
			}
			if _, err := victim.Push(ctx(t), true, reqs...); err != nil {
				t.Fatal(err)
			}
			if err := a.Deregister(doomed); err != nil {
				t.Fatalf("round %d: deregister: %v", round, err)
			}
			if n := core.MRUses(doomed); n != 0 {
				t.Fatalf("round %d: deregister returned with %d uses", round, n)
			}
			victim.Push(ctx(t), true, krcore.Request{ID: k, Op: verbs.OpRead, Local: doomed.Range(0, 8), Remote: pub.At(0)})
			out := make([]krcore.Completion, k+1)
			for got := 0; got < k+1; {
				n, err := victim.PopWait(ctx(t), out[got:])
				if err != nil {
					t.Fatal(err)
				}
				got += n
			}
			for i, wc := range out[:k] {
				if wc.ID != uint64(i) || wc.Status != verbs.Success {
					t.Fatalf("round %d: request %d accepted before Deregister: %+v", round, i, wc)
				}
			}
			if wc := out[k]; !errors.Is(wc.Err(), krcore.ErrRefused) && wc.Status != verbs.LocProtErr {
				t.Fatalf("round %d: request after Deregister: %+v, want LOC_PROT_ERR", round, wc)
			}
		}
		for _, err := range stop() {
			if err != nil {
				t.Error(err)
			}
		}
		if st := a.Stats(); st.Recoveries != 0 {
			t.Errorf("the shared QP broke %d times", st.Recoveries)
		}
	}, modeDC, modeNoDC)
}

// TestDeregisterPostedRecv: a receive buffer posted in an MR that is then
// deregistered is forgotten, not written: Deregister does not wait for a
// message, and one that comes later is kept as a copy.
func TestDeregisterPostedRecv(t *testing.T) {
	c := start(t, 2, core.Config{})
	a, b := c.Node(1), c.Node(2)
	srv := mustQueue(t, b, 1)
	if err := srv.Bind(7); err != nil {
		t.Fatal(err)
	}
	inbox, _ := b.RegMR(1<<20, verbs.AccessLocalWrite)
	if err := srv.PushRecv(inbox.Range(0, 64)); err != nil {
		t.Fatal(err)
	}
	if err := b.Deregister(inbox); err != nil {
		t.Fatal(err)
	}
	if err := srv.PushRecv(inbox.Range(0, 64)); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("PushRecv into a deregistered MR: %v", err)
	}
	cli := mustQueue(t, a, 2, &krcore.ConnectOptions{Port: 7})
	msg, _ := a.RegMR(64, verbs.AccessLocalWrite)
	copy(msg.Bytes(), "hello")
	cli.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: msg.Range(0, 5)})
	if wc := pop1(t, cli); wc.Status != verbs.Success {
		t.Fatalf("send: %+v", wc)
	}
	var got [1]krcore.Message
	if _, err := srv.PopMsgsWait(ctx(t), got[:]); err != nil {
		t.Fatal(err)
	}
	if got[0].Buf != nil || !bytes.Equal(got[0].Data, []byte("hello")) {
		t.Errorf("message: %+v", got[0])
	}
}

// TestDeregisterIdleQueues: an MR whose requests all finished is
// deregistered at once, whatever queues used it (idle, closed, or busy on
// another MR since), and refused to them afterwards; the queues carry on
// with their other MRs.
func TestDeregisterIdleQueues(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{RCPeers: -1})
		a, b := c.Node(1), c.Node(2)
		newExporter(t, b)
		pub, err := a.Region(ctx(t), 2, "pub")
		if err != nil {
			t.Fatal(err)
		}
		read := func(q *core.Queue, mr krcore.MR) verbs.Status {
			t.Helper()
			if _, err := q.Push(ctx(t), true, krcore.Request{ID: 7, Op: verbs.OpRead, Local: mr.Range(0, 8), Remote: pub.At(0)}); err != nil {
				t.Fatal(err)
			}
			return pop1(t, q).Status
		}
		idle, moved, closed := mustQueue(t, a, 2), mustQueue(t, a, 2), mustQueue(t, a, 2)
		for round := 0; round < 3; round++ {
			mr, _ := a.RegMR(64, verbs.AccessAll)
			other, _ := a.RegMR(64, verbs.AccessAll)
			for _, q := range []*core.Queue{idle, moved, closed} {
				if st := read(q, mr); st != verbs.Success {
					t.Fatalf("round %d: read: %s", round, st)
				}
			}
			if st := read(moved, other); st != verbs.Success {
				t.Fatalf("round %d: read into another MR: %s", round, st)
			}
			if round == 2 {
				closed.Close()
			}
			start := time.Now()
			if err := a.Deregister(mr); err != nil {
				t.Fatalf("round %d: deregister: %v", round, err)
			}
			if n := core.MRUses(mr); n != 0 {
				t.Fatalf("round %d: deregister returned with %d uses", round, n)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("round %d: deregister of an MR no request uses took %v", round, d)
			}
			if st := read(idle, mr); st != verbs.LocProtErr {
				t.Errorf("round %d: read into the deregistered MR: %s, want LOC_PROT_ERR", round, st)
			}
			for _, q := range []*core.Queue{idle, moved} {
				if st := read(q, other); st != verbs.Success {
					t.Fatalf("round %d: read into a live MR after a deregistration: %s", round, st)
				}
			}
			if err := a.Deregister(other); err != nil {
				t.Fatalf("round %d: deregister the other MR: %v", round, err)
			}
		}
	}, modeDC, modeNoDC)
}
