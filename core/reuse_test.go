package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestNodeIDReused: a node's process exits and a new one comes up under
// the same node id (a new soft RNIC: new address, DCT and QPNs). The node
// that served the old one has it cached (its record, its DC target and
// control QP, pooled RC QPs, its dead state); the new one must still be
// reached within a bounded time, both ways: its SEND to a bound port
// reaches the server, the server's reply reaches the new process, not the
// old, and the server's READ of the new process's memory reads it.
func TestNodeIDReused(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		// HotOps 1: a and every life of node 2 build RC QPs to each other,
		// which the next life finds stale.
		cfg := m.config(1, core.Config{HotOps: 1, HotWindow: 5 * time.Millisecond})
		c := m.start(t, 1, cfg.Runtime)
		a := c.Node(1)
		srv, err := a.Queue()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		if err := srv.Bind(7); err != nil {
			t.Fatal(err)
		}
		abuf, _ := a.RegMR(4096, verbs.AccessAll)
		for gen := 0; gen < 3; gen++ {
			if err := c.Add(ctx(t), cfg, 2); err != nil {
				t.Fatalf("generation %d: start node 2: %v", gen, err)
			}
			b := c.Node(2)
			reuseRound(t, m, a, b, srv, abuf, gen)
			if err := c.Remove(2, gen%2 == 1); err != nil {
				t.Fatal(err)
			}
		}
	}, modeDC, modeNoDC)
}

// reuseRound is one life of node 2 (b) talking to node 1 (a): b SENDs to
// a's port 7, a answers on b's port 8, a READs b's region "b"; each within
// a bound.
func reuseRound(t *testing.T, m mode, a, b *core.Runtime, srv *core.Queue, abuf krcore.MR, gen int) {
	t.Helper()
	bound, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bmem := serve(t, b, "b", 64)
	copy(bmem.Bytes(), []byte{byte('A' + gen)})
	bq, err := b.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer bq.Close()
	if err := bq.Bind(8); err != nil {
		t.Fatal(err)
	}
	bbuf, _ := b.RegMR(64, verbs.AccessAll)
	if err := bq.PushRecv(bbuf.Range(32, 32)); err != nil {
		t.Fatal(err)
	}
	if err := bq.Connect(bound, 1, &krcore.ConnectOptions{Port: 7}); err != nil {
		t.Fatalf("generation %d: b connects to a: %v", gen, err)
	}
	bbuf.Bytes()[0] = byte(gen)
	bq.Push(bound, true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: bbuf.Range(0, 1)})
	var out [1]krcore.Completion
	if _, err := bq.PopWait(bound, out[:]); err != nil || out[0].Status != verbs.Success {
		t.Fatalf("generation %d: b's SEND: %+v %v", gen, out[0], err)
	}
	var msgs [1]krcore.Message
	if _, err := srv.PopMsgsWait(bound, msgs[:]); err != nil {
		t.Fatalf("generation %d: a never got b's SEND: %v", gen, err)
	}
	if msgs[0].From != 2 || msgs[0].Port != 8 || msgs[0].Data[0] != byte(gen) {
		t.Fatalf("generation %d: a got %+v", gen, msgs[0])
	}
	aq, err := a.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer aq.Close()
	if err := aq.Connect(bound, 2, &krcore.ConnectOptions{Port: 8}); err != nil {
		t.Fatalf("generation %d: a connects to the new b: %v", gen, err)
	}
	abuf.Bytes()[0] = byte(100 + gen)
	aq.Push(bound, true, krcore.Request{ID: 2, Op: verbs.OpSend, Local: abuf.Range(0, 1)})
	if _, err := aq.PopWait(bound, out[:]); err != nil || out[0].Status != verbs.Success {
		t.Fatalf("generation %d: a's reply SEND: %+v %v", gen, out[0], err)
	}
	if _, err := bq.PopMsgsWait(bound, msgs[:]); err != nil {
		t.Fatalf("generation %d: the new b never got a's reply: %v", gen, err)
	}
	if msgs[0].From != 1 || bbuf.Bytes()[32] != byte(100+gen) {
		t.Fatalf("generation %d: b got %+v %d", gen, msgs[0], bbuf.Bytes()[32])
	}
	g, err := aq.Region(bound, "b")
	if err != nil {
		t.Fatalf("generation %d: a looks up the new b's region: %v", gen, err)
	}
	aq.Push(bound, true, krcore.Request{ID: 3, Op: verbs.OpRead, Local: abuf.Range(8, 1), Remote: g.At(0)})
	if _, err := aq.PopWait(bound, out[:]); err != nil || out[0].Status != verbs.Success {
		t.Fatalf("generation %d: a's READ of the new b: %+v %v", gen, out[0], err)
	}
	if got := abuf.Bytes()[8]; got != byte('A'+gen) {
		t.Fatalf("generation %d: a READ %q from b, want %q", gen, got, byte('A'+gen))
	}
	// Both sides hot: the pool manager builds RC QPs between a and this b.
	for deadline := time.Now().Add(5 * time.Second); a.Stats().RCs == 0 || b.Stats().RCs == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("generation %d: no RC QP between a and b: %+v", gen, a.Stats())
		}
		aq.Push(bound, true, krcore.Request{ID: 4, Op: verbs.OpRead, Local: abuf.Range(8, 1), Remote: g.At(0)})
		if _, err := aq.PopWait(bound, out[:]); err != nil || out[0].Status != verbs.Success {
			t.Fatalf("generation %d: a's READ of b: %+v %v", gen, out[0], err)
		}
		time.Sleep(time.Millisecond)
	}
	_ = m
}
