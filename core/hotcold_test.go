package core_test

import (
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestHotOneWayKeepsRC: node 1 READs from node 2 at a hot rate, one way
// (node 2 pushes nothing): the pair builds one RC QP and keeps it for the
// whole stream. The accepting side sees no pushes of its own, yet must not
// evict what the initiator keeps hot: no eviction on either side, and the
// reader's queue migrates once (DCI to RC). Cold is 500 windows (1 s): a
// starved reader (plain go test at load ~25) stalled past 0.5 s once and
// lost its QP; the stream runs three cold periods, so a target that
// evicted what it does not push itself would still do so within it.
func TestHotOneWayKeepsRC(t *testing.T) {
	c := start(t, 2, core.Config{DCIs: 1, HotOps: 5, HotWindow: 2 * time.Millisecond, ColdWindows: 500, Path: patientPath})
	a, b := c.Node(1), c.Node(2)
	q, req := reader(t, a, b, "r")
	var out [8]krcore.Completion
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		for i := range 4 {
			req.ID = uint64(i)
			if _, err := q.Push(ctx(t), true, req); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < 4; {
			n, err := q.PopWait(ctx(t), out[:])
			if err != nil {
				t.Fatal(err)
			}
			for _, wc := range out[:n] {
				if wc.Status != verbs.Success {
					t.Fatalf("READ: %+v", wc)
				}
			}
			got += n
		}
	}
	sa, sb := a.Stats(), b.Stats()
	t.Logf("reader %+v; target %+v", sa, sb)
	if sa.RCBuilt != 1 || sb.RCBuilt != 1 {
		t.Errorf("RC QPs built: reader %d, target %d, want 1 each (one pair for the whole stream)", sa.RCBuilt, sb.RCBuilt)
	}
	if sa.RCEvicted != 0 || sb.RCEvicted != 0 {
		t.Errorf("RC QPs evicted during a hot stream: reader %d, target %d, want 0", sa.RCEvicted, sb.RCEvicted)
	}
	if sa.Migrations != 1 {
		t.Errorf("reader's queue migrated %d times, want 1 (DCI to RC)", sa.Migrations)
	}
	if sa.RCs != 1 || sb.RCs != 1 {
		t.Errorf("RC QPs at the end: reader %d, target %d, want 1 each", sa.RCs, sb.RCs)
	}
}

// TestReverseHotKeepsRC: node 1 builds an RC QP to node 2 by reading hot,
// then falls silent while node 2 reads from node 1 hot over the same QP:
// node 1 (the builder, idle itself) must not evict what the other end
// keeps hot. Once both are idle it goes, on both ends. Cold is 250
// windows (0.5 s), far above the tens of milliseconds a stream's
// goroutine can stall on a loaded machine under -race: a stall as long
// as the cold period looks like the stream's end.
func TestReverseHotKeepsRC(t *testing.T) {
	c := start(t, 2, core.Config{DCIs: 1, HotOps: 20, HotWindow: 2 * time.Millisecond, ColdWindows: 250, Path: patientPath})
	a, b := c.Node(1), c.Node(2)
	qa, reqA := reader(t, a, b, "r")
	qb, reqB := reader(t, b, a, "r")
	stream := func(q *core.Queue, req krcore.Request, d time.Duration) {
		t.Helper()
		var out [4]krcore.Completion
		for end := time.Now().Add(d); time.Now().Before(end); {
			if _, err := q.Push(ctx(t), true, req, req); err != nil {
				t.Fatal(err)
			}
			for got := 0; got < 2; {
				n, err := q.PopWait(ctx(t), out[:])
				if err != nil {
					t.Fatal(err)
				}
				got += n
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.Stats().RCs == 0 || b.Stats().RCs == 0 {
		stream(qa, reqA, 10*time.Millisecond)
		if time.Now().After(deadline) {
			t.Fatalf("no RC QP: %+v", a.Stats())
		}
	}
	stream(qb, reqB, time.Second) // twice node 1's cold period
	sa, sb := a.Stats(), b.Stats()
	t.Logf("after node 2's stream: node 1 %+v; node 2 %+v", sa, sb)
	if sa.RCEvicted != 0 || sb.RCEvicted != 0 || sa.RCBuilt != 1 || sb.RCBuilt != 1 {
		t.Errorf("the pair's RC QP changed while node 2 kept it hot: node 1 built %d evicted %d, node 2 built %d evicted %d",
			sa.RCBuilt, sa.RCEvicted, sb.RCBuilt, sb.RCEvicted)
	}
	for a.Stats().RCEvicted == 0 || b.Stats().RCs != 0 {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatalf("the RC QP was not evicted once both ends were idle: node 1 %+v; node 2 %+v", a.Stats(), b.Stats())
		}
		time.Sleep(5 * time.Millisecond) // the policy runs on its own schedule
	}
}

// TestDeadPeerRCReleased: an idle RC QP to a peer that died is evicted and
// destroyed, not left half-closed waiting for the dead end to drain.
//
// patientPath: a READ of the set-up that a loaded machine stalls past the
// default 200 ms would find the live peer dead. The RC QP may go cold and
// be evicted (and built again) while the set-up pushes, when the pushing
// goroutine does not run for five windows: every RC QP built is evicted in
// the end, however many.
func TestDeadPeerRCReleased(t *testing.T) {
	c := start(t, 2, core.Config{DCIs: 1, HotOps: 5, HotWindow: 2 * time.Millisecond, ColdWindows: 5, Path: patientPath})
	a := c.Node(1)
	q, req := reader(t, a, c.Node(2), "r")
	var out [4]krcore.Completion
	deadline := time.Now().Add(20 * time.Second) // the RC handshake, starved
	for a.Stats().RCs == 0 {
		if _, err := q.Push(ctx(t), true, req, req); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < 2; {
			n, err := q.PopWait(ctx(t), out[:])
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
		if time.Now().After(deadline) {
			t.Fatalf("no RC QP: %+v", a.Stats())
		}
	}
	if err := c.Remove(2, true); err != nil {
		t.Fatal(err)
	}
	rcLeft := func() int {
		n := 0
		for _, p := range a.PoolQPs() {
			if p.Type == core.QPTypeRC {
				n++
			}
		}
		return n
	}
	deadline = time.Now().Add(20 * time.Second)
	for rcLeft() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("RC QP to the dead peer still there: %+v; %+v", a.PoolQPs(), a.Stats())
		}
		time.Sleep(5 * time.Millisecond) // the policy runs on its own schedule
	}
	if s := a.Stats(); s.RCEvicted != s.RCBuilt || s.PeersDead != 1 {
		t.Errorf("stats %+v, want every RC QP built evicted and 1 peer dead", s)
	}
}
