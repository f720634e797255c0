package core_test

import (
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestPoolQPs: the snapshot lists every shared QP once (DCT and DCIs with
// DC, the RC QP alone without), with its peer, state and the VQs routed to
// it; the meta cache lists the peer; Forget takes an RC-only node's RC QP
// out, and a closed runtime has none.
func TestPoolQPs(t *testing.T) {
	inModes(t, func(t *testing.T, m mode) {
		c := m.start(t, 2, core.Config{DCIs: 2, RCPeers: -1})
		a, b := c.Node(1), c.Node(2)
		serve(t, b, "data", 4096)
		local, _ := a.RegMR(64, verbs.AccessAll)
		for range 3 {
			q := mustQueue(t, a, 2)
			g, err := q.Region(ctx(t), "data")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := q.Push(ctx(t), true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(0)}); err != nil {
				t.Fatal(err)
			}
			if wc := pop1(t, q); wc.Status != verbs.Success {
				t.Fatalf("READ: %+v", wc)
			}
		}
		qps := a.PoolQPs()
		count := map[core.QPType]int{}
		vqs, posted := 0, uint64(0)
		seen := map[uint32]bool{}
		for _, p := range qps {
			count[p.Type]++
			vqs += p.VQs
			posted += p.Posted
			if seen[p.QPN] || p.QPN == 0 || p.State != core.QPReady || p.InFlight != 0 || p.Queued != 0 ||
				(p.Type == core.QPTypeRC) != (p.Peer == 2 && p.RemoteQPN != 0) || p.Type != core.QPTypeRC && p.Peer != 0 {
				t.Errorf("row %+v", p)
			}
			seen[p.QPN] = true
		}
		want := map[core.QPType]int{core.QPTypeDCT: 1, core.QPTypeDCI: 2}
		if m.noDC || m.rcOnly {
			want = map[core.QPType]int{core.QPTypeRC: 1}
		}
		if len(count) != len(want) || count[core.QPTypeDCT] != want[core.QPTypeDCT] || count[core.QPTypeDCI] != want[core.QPTypeDCI] ||
			count[core.QPTypeRC] != want[core.QPTypeRC] || vqs != 3 || posted < 3 {
			t.Fatalf("pool QPs %+v: want %v, 3 VQs, 3 posts at least", qps, want)
		}
		if qps[0].Type == core.QPTypeDCT && (qps[1].VQs+qps[2].VQs != 3 || qps[1].QPN > qps[2].QPN) {
			t.Errorf("DCIs out of order or VQs not on them: %+v", qps)
		}
		// The meta cache holds node 2's record: its DCT is the one node 2
		// lists (none without DC).
		dct := uint32(0)
		if bq := b.PoolQPs(); bq[0].Type == core.QPTypeDCT {
			dct = bq[0].QPN
		}
		if e := a.MetaEntries(); len(e) != 1 || e[0].Node != 2 || e[0].DCTNum != dct || e[0].Version == 0 || e[0].CtrlQPN == 0 {
			t.Errorf("meta cache %+v, want node 2 with DCT %d", e, dct)
		}
		if m.noDC || m.rcOnly {
			// The other end: its RC QP names ours.
			var theirs []core.PoolQP
			for _, p := range b.PoolQPs() {
				if p.Type == core.QPTypeRC {
					theirs = append(theirs, p)
				}
			}
			if len(theirs) != 1 || theirs[0].Peer != 1 || theirs[0].RemoteQPN != qps[0].QPN || theirs[0].QPN != qps[0].RemoteQPN || theirs[0].VQs != 0 {
				t.Errorf("node 2's RC QPs %+v, node 1's %+v", theirs, qps[0])
			}
			if err := a.Forget(ctx(t), 2); err != nil {
				t.Fatal(err)
			}
			// Our end closes once the other end has drained too.
			deadline := time.Now().Add(5 * time.Second)
			for {
				qps := a.PoolQPs()
				if len(qps) == 0 {
					break
				}
				if p := qps[0]; p.Type != core.QPTypeRC || p.State != core.QPClosing && p.State != core.QPClosed || time.Now().After(deadline) {
					t.Fatalf("after Forget: %+v", qps)
				}
				time.Sleep(time.Millisecond)
			}
		}
		b.Close()
		if qps := b.PoolQPs(); qps != nil {
			t.Errorf("closed runtime: %+v", qps)
		}
	}, modeDC, modeNoDC, modeForced)
}

// samplePool calls PoolQPs every millisecond until stop closes and reports
// how often each state was seen; rows that break the snapshot's rules fail
// t. Under -race it checks PoolQPs against the pool's own goroutines.
func samplePool(t *testing.T, rt *core.Runtime, stop <-chan struct{}) <-chan map[core.QPState]int {
	out := make(chan map[core.QPState]int, 1)
	go func() {
		seen := map[core.QPState]int{}
		defer func() { out <- seen }()
		for {
			for _, p := range rt.PoolQPs() {
				seen[p.State]++
				if (p.Type == core.QPTypeRC) != (p.Peer != 0) || p.VQs < 0 || p.InFlight < 0 || p.Queued < 0 {
					t.Errorf("row %+v", p)
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return out
}
