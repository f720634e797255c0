package core_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestRCOnlyConnect: without DC a cold Connect reads the MetaServer once
// and builds an RC QP with the node; a warm one reuses it and costs
// neither; Forget closes it (both ends), so the next Connect is cold again.
func TestRCOnlyConnect(t *testing.T) {
	c := modeNoDC.start(t, 2, core.Config{})
	a, b := c.Node(2), c.Node(1)
	q, _ := a.Queue()
	defer q.Close()
	for round := 1; round <= 2; round++ {
		reads := a.MetaStats().Reads
		if err := q.Connect(ctx(t), 1, nil); err != nil {
			t.Fatal(err)
		}
		st := a.Stats()
		if st.RCBuilt != uint64(round) || st.RCs != 1 || a.MetaStats().Reads != reads+1 {
			t.Fatalf("cold connect %d: %+v, %d MetaServer READs", round, st, a.MetaStats().Reads-reads)
		}
		for range 3 {
			if err := q.Connect(ctx(t), 1, nil); err != nil {
				t.Fatal(err)
			}
		}
		if st := a.Stats(); st.RCBuilt != uint64(round) || a.MetaStats().Reads != reads+1 {
			t.Fatalf("warm connects built or read: %+v", st)
		}
		if err := a.Forget(ctx(t), 1); err != nil {
			t.Fatal(err)
		}
		if n := a.Stats().RCs; n != 0 {
			t.Fatalf("%d RC QPs after Forget", n)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.Stats().RCs != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the node kept %d RC QPs the other end closed", b.Stats().RCs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRCOnlyBudget: with room for one RC peer, connecting to a second
// peer evicts the idle first; its VQ gets a new RC QP when it next pushes.
// When the holder is busy, Connect fails with ErrNoQP instead.
func TestRCOnlyBudget(t *testing.T) {
	c := modeNoDC.start(t, 4, core.Config{RCPeers: 1})
	a := c.Node(1)
	var gs [5]krcore.Region
	for n := krcore.NodeID(2); n <= 4; n++ {
		serve(t, c.Node(n), "r", 64)
	}
	q2, q3 := mustQueue(t, a, 2), mustQueue(t, a, 3) // 3 evicts the idle 2
	if st := a.Stats(); st.RCs != 1 || st.RCEvicted != 1 {
		t.Fatalf("after connecting a second peer: %+v", st)
	}
	local, _ := a.RegMR(64, verbs.AccessAll)
	read := func(q *core.Queue, node krcore.NodeID) krcore.Completion {
		t.Helper()
		if gs[node] == nil {
			g, err := q.Region(ctx(t), "r")
			if err != nil {
				t.Fatal(err)
			}
			gs[node] = g
		}
		if _, err := q.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: gs[node].At(0)}); err != nil {
			t.Fatal(err)
		}
		return pop1(t, q)
	}
	if wc := read(q2, 2); wc.Status != verbs.Success { // back to 2: evicts 3
		t.Fatalf("READ after eviction: %+v", wc)
	}
	if wc := read(q3, 3); wc.Status != verbs.Success {
		t.Fatalf("READ on the peer evicted in turn: %+v", wc)
	}
	if st := a.Stats(); st.RCs != 1 || st.RCBuilt != 4 {
		t.Fatalf("stats %+v: want 1 RC QP, 4 built", st)
	}
	// Keep node 3's RC QP busy: its node dies with a READ in flight, which
	// stays in flight until the retry timeout.
	c.Devices[2].Close()
	if _, err := q3.Push(ctx(t), true, krcore.Request{ID: 2, Op: verbs.OpRead, Local: local.Range(8, 8), Remote: gs[3].At(0)}); err != nil {
		t.Fatal(err)
	}
	q4, _ := a.Queue()
	defer q4.Close()
	if err := q4.Connect(ctx(t), 4, nil); !errors.Is(err, krcore.ErrNoQP) {
		t.Fatalf("connect with the pool busy: %v, want ErrNoQP", err)
	}
	if wc := pop1(t, q3); wc.Status != verbs.RetryExcErr {
		t.Fatalf("READ to the dead node: %+v", wc)
	}
	if err := q4.Connect(ctx(t), 4, nil); err != nil {
		t.Fatalf("connect once the dead node's RC QP is gone: %v", err)
	}
}

// TestUnpolledReceiver: a node whose applications never poll for messages
// still keeps its shared receive queue stocked. WRITE_WITH_IMMs beyond its
// RecvSlots once met an empty SRQ there: the sender's shared QP got RNR
// NAKs for good and every VQ on it hung behind the message (seen as
// TestMalformedNeighbours/rc-only hanging, its fuzzers' WRITE_WITH_IMMs
// having used up the target's slots). Both kinds take a slot: raw ones,
// and a runtime's notifications (here to a port nobody bound).
func TestUnpolledReceiver(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		const slots = 8
		c := m.start(t, 2, core.Config{RecvSlots: slots})
		a, b := c.Node(1), c.Node(2)
		serve(t, b, "r", 64)
		q := mustQueue(t, a, 2, &krcore.ConnectOptions{Port: 5})
		g, err := q.Region(ctx(t), "r")
		if err != nil {
			t.Fatal(err)
		}
		local, _ := a.RegMR(8, verbs.AccessAll)
		out := make([]krcore.Completion, 1)
		for i := range 4 * slots {
			wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			req := krcore.Request{ID: uint64(i), Op: verbs.OpWriteImm, Local: local.Range(0, 8), Remote: g.At(0), Imm: uint32(i)}
			push := func() error { _, err := q.Push(wctx, true, req); return err }
			if i%2 == 0 {
				push = func() error { return core.PushRaw(wctx, q, req) }
			}
			if err := push(); err != nil {
				cancel()
				t.Fatal(err)
			}
			_, err := q.PopWait(wctx, out)
			cancel()
			if err != nil {
				t.Fatalf("WRITE_WITH_IMM %d to a node that never polls (%d receive slots): %v", i, slots, err)
			}
			if out[0].Status != verbs.Success {
				t.Fatalf("WRITE_WITH_IMM %d: %+v", i, out[0])
			}
		}
	}, modeDC, modeNoDC)
}

// TestRCOnlyEvictsOwnFirst: in RC-only mode a node whose pool is full
// makes room by evicting an idle RC QP it built, not one it accepted from
// a node that reads it hot: it never sees those one-sided READs, and
// evicting their QP makes the reader build another at once.
func TestRCOnlyEvictsOwnFirst(t *testing.T) {
	c := modeNoDC.start(t, 4, core.Config{RCPeers: 2})
	a, b := c.Node(1), c.Node(2)
	q, req := reader(t, a, b, "r") // node 1 builds, node 2 accepts
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go hammer(q, req, stop, &wg)
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(50 * time.Millisecond) // windows pass: node 2 sees node 1 idle, as it never pushes to it
	mustQueue(t, b, 3)                // node 2 builds its own, to node 3, and leaves it idle
	time.Sleep(30 * time.Millisecond)
	mustQueue(t, b, 4) // the pool is full: something must go
	if st := a.Stats(); st.RCEvicted != 0 {
		t.Errorf("node 1's RC QP, read hot, was evicted by the node that accepted it: %+v", st)
	}
	for _, p := range b.PoolQPs() {
		if p.Type == core.QPTypeRC && p.Peer == 3 && p.State == core.QPReady {
			t.Errorf("node 2 kept its idle RC QP to node 3 and evicted another: %+v", b.PoolQPs())
		}
	}
}
