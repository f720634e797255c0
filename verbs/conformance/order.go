package conformance

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/krcore/krcore/verbs"
)

func orderTests() []testCase {
	return []testCase{
		{name: "SendInOrder", run: testSendInOrder},
		{name: "FetchAddExactlyOnce", needs: []string{CapAtomic}, run: testFAAExactlyOnce},
		{name: "ConcurrentPosters", needs: []string{CapAtomic}, run: testConcurrentPosters},
		{name: "ConcurrentQPs", needs: []string{CapAtomic}, run: testConcurrentQPs},
	}
}

// pump posts total WRs made by mk on qp, keeping at most window
// outstanding, and returns the completions in arrival order. It never
// calls t.Fatal, so goroutines can use it.
func pump(ctx context.Context, qp verbs.QP, cq verbs.CQ, total, window int, mk func(i int) verbs.SendWR) ([]verbs.WC, error) {
	out := make([]verbs.WC, 0, total)
	buf := make([]verbs.WC, window)
	wrs := make([]verbs.SendWR, 0, window)
	posted := 0
	for len(out) < total {
		wrs = wrs[:0]
		for posted+len(wrs) < total && posted+len(wrs)-len(out) < window {
			wrs = append(wrs, mk(posted+len(wrs)))
		}
		if len(wrs) > 0 {
			n, err := qp.PostSend(wrs)
			posted += n
			if err != nil {
				return out, fmt.Errorf("PostSend with %d outstanding: %w", posted-len(out), err)
			}
		}
		k, err := pollSome(ctx, cq, buf)
		out = append(out, buf[:k]...)
		if err != nil {
			return out, fmt.Errorf("after %d of %d completions: %w", len(out), total, err)
		}
	}
	return out, nil
}

// checkSeq checks that wcs are successful completions of WRs 0..len-1 in
// that order.
func checkSeq(wcs []verbs.WC, op verbs.WCOpcode) error {
	for i, wc := range wcs {
		if wc.Status != verbs.Success || wc.Op != op {
			return fmt.Errorf("completion %d: WR %d %s %s, want SUCCESS %s", i, wc.ID, wc.Status, wc.Op, op)
		}
		if wc.ID != uint64(i) {
			return fmt.Errorf("completion %d is WR %d: RC completions out of post order", i, wc.ID)
		}
	}
	return nil
}

// testSendInOrder: SENDs arrive, and complete on both sides, in post
// order, each exactly once.
func testSendInOrder(t *testing.T, e *env) {
	const window = 32
	total := min(500, e.b.dev.Attr().MaxQPWR)
	p := e.rc(rcOpts{cap: verbs.QPCap{MaxSendWR: window, MaxRecvWR: total}, cb: e.b.cq(total)})
	src, dst := e.a.mr(total*8, verbs.AccessAll), e.b.mr(total*8, verbs.AccessAll)
	for i := range total {
		binary.NativeEndian.PutUint64(src.mem[i*8:], uint64(i))
		postRecv(t, p.qb, recvWR(uint64(i), dst.sge(i*8, 8)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.o.timeout())
	defer cancel()
	wcs, err := pump(ctx, p.qa, p.ca, total, window, func(i int) verbs.SendWR { return sendWR(uint64(i), src.sge(i*8, 8)) })
	if err == nil {
		err = checkSeq(wcs, verbs.WCSend)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSeq(e.wcs(p.cb, total), verbs.WCRecv); err != nil {
		t.Fatalf("receiver: %v", err)
	}
	for i := range total {
		if got := dst.u64(i * 8); got != uint64(i) {
			t.Fatalf("receive %d holds message %d", i, got)
		}
	}
	empty(t, p.cb)
}

// testFAAExactlyOnce: 1000 FAA(1) from one QP leave the counter at exactly
// 1000, complete in post order, and each fetched the value its position
// predicts: no WR was lost, repeated or reordered.
func testFAAExactlyOnce(t *testing.T, e *env) {
	const total, window = 1000, 64
	p := e.rc(rcOpts{cap: verbs.QPCap{MaxSendWR: window}})
	res, ctr := e.a.mr(total*8, verbs.AccessAll), e.b.mr(8, verbs.AccessAll)
	ctx, cancel := context.WithTimeout(context.Background(), e.o.timeout())
	defer cancel()
	wcs, err := pump(ctx, p.qa, p.ca, total, window, func(i int) verbs.SendWR { return faaWR(uint64(i), res.sge(i*8, 8), ctr, 0, 1) })
	if err == nil {
		err = checkSeq(wcs, verbs.WCFetchAdd)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := ctr.u64(0); got != total {
		t.Fatalf("counter %d after %d FAA(1)", got, total)
	}
	for i := range total {
		if got := res.u64(i * 8); got != uint64(i) {
			t.Fatalf("FAA %d fetched %d, want %d", i, got, i)
		}
	}
}

// fetchedAll checks that the values fetched by n FAA(1) on one counter are
// exactly 0..n-1.
func fetchedAll(res region, n int) error {
	seen := make([]bool, n)
	for i := range n {
		v := res.u64(i * 8)
		if v >= uint64(n) || seen[v] {
			return fmt.Errorf("FAA %d fetched %d: duplicated or out of range", i, v)
		}
		seen[v] = true
	}
	return nil
}

// testConcurrentPosters: goroutines post on one QP at once. Every WR
// completes exactly once, and each poster's WRs complete in its order.
func testConcurrentPosters(t *testing.T, e *env) {
	const posters, per, window = 4, 200, 16
	p := e.rc(rcOpts{cap: verbs.QPCap{MaxSendWR: posters * window}})
	res, ctr := e.a.mr(posters*per*8, verbs.AccessAll), e.b.mr(8, verbs.AccessAll)
	ctx, cancel := context.WithTimeout(context.Background(), e.o.timeout())
	defer cancel()

	// Each poster holds window credits; the poller returns one per
	// completion, so the queue can never overflow.
	credits := make([]chan struct{}, posters)
	var wg sync.WaitGroup
	for g := range posters {
		credits[g] = make(chan struct{}, window)
		for range window {
			credits[g] <- struct{}{}
		}
		wg.Go(func() {
			for j := range per {
				select {
				case <-credits[g]:
				case <-ctx.Done():
					return
				}
				slot := g*per + j
				wr := faaWR(uint64(g)<<32|uint64(j), res.sge(slot*8, 8), ctr, 0, 1)
				if _, err := p.qa.PostSend([]verbs.SendWR{wr}); err != nil {
					t.Errorf("poster %d WR %d: %v", g, j, err)
					cancel()
					return
				}
			}
		})
	}
	// Cancel before waiting, so posters blocked on credits leave when
	// the poller gives up.
	defer wg.Wait()
	defer cancel()

	next := make([]int, posters)
	buf := make([]verbs.WC, 32)
	for done := 0; done < posters*per; {
		k, err := pollSome(ctx, p.ca, buf)
		if err != nil {
			t.Fatalf("after %d completions: %v", done, err)
		}
		for _, wc := range buf[:k] {
			g, j := int(wc.ID>>32), int(uint32(wc.ID))
			if wc.Status != verbs.Success || g >= posters || j != next[g] {
				t.Fatalf("completion %d: WR %d/%d %s; poster's next expected %v", done, g, j, wc.Status, next)
			}
			next[g]++
			credits[g] <- struct{}{}
			done++
		}
	}
	if got := ctr.u64(0); got != posters*per {
		t.Fatalf("counter %d, want %d", got, posters*per)
	}
	if err := fetchedAll(res, posters*per); err != nil {
		t.Fatal(err)
	}
}

// testConcurrentQPs: several QPs, each driven by its own goroutine, add to
// one remote counter; every FAA happens exactly once.
func testConcurrentQPs(t *testing.T, e *env) {
	const qps, per, window = 4, 250, 32
	res, ctr := e.a.mr(qps*per*8, verbs.AccessAll), e.b.mr(8, verbs.AccessAll)
	pairs := make([]*rcPair, qps)
	for i := range pairs {
		pairs[i] = e.rc(rcOpts{cap: verbs.QPCap{MaxSendWR: window}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.o.timeout())
	defer cancel()
	var wg sync.WaitGroup
	for q, p := range pairs {
		wg.Go(func() {
			wcs, err := pump(ctx, p.qa, p.ca, per, window, func(i int) verbs.SendWR {
				return faaWR(uint64(i), res.sge((q*per+i)*8, 8), ctr, 0, 1)
			})
			if err == nil {
				err = checkSeq(wcs, verbs.WCFetchAdd)
			}
			if err != nil {
				t.Errorf("QP %d: %v", q, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if got := ctr.u64(0); got != qps*per {
		t.Fatalf("counter %d, want %d", got, qps*per)
	}
	if err := fetchedAll(res, qps*per); err != nil {
		t.Fatal(err)
	}
}
