package soft_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestCrossLargeReads: two TCP nodes READ megabytes from each other at
// once. Each link's reader also writes the responses to the other side's
// requests; if it blocked on a full socket while the peer's reader did the
// same, neither would read again and both sides' requests would time out.
func TestCrossLargeReads(t *testing.T) {
	const size, reads = 2 << 20, 4
	a, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	// A path that gives megabyte READs time under the race detector.
	x, y := newSide(t, a, 2*size), newSide(t, b, 2*size)
	p := verbs.Path{Timeout: 2 * time.Second, RetryCount: 3}
	if err := verbs.Connect(x.qp, y.qp.Endpoint(), p); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(y.qp, x.qp.Endpoint(), p); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, s := range [][2]*side{{x, y}, {y, x}} {
		from, to := s[0], s[1]
		wg.Add(1)
		go func() {
			defer wg.Done()
			wrs := make([]verbs.SendWR, reads)
			for i := range wrs {
				wrs[i] = verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, Flags: verbs.Signaled,
					SGL: []verbs.SGE{verbs.SGEOf(from.mr, (i%2)*size, size)}, RemoteAddr: to.mr.Addr() + uint64(i%2*size), RKey: to.mr.RKey()}
			}
			if _, err := from.qp.PostSend(wrs); err != nil {
				t.Error(err)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var wc [4]verbs.WC
			for got := 0; got < reads; {
				n, err := from.cq.Poll(wc[:])
				if err != nil {
					t.Error(err)
					return
				}
				for _, c := range wc[:n] {
					if c.Status != verbs.Success {
						t.Errorf("READ %d: %v", c.ID, c.Status)
					}
				}
				got += n
				if n == 0 {
					if err := from.cq.Wait(ctx); err != nil {
						t.Errorf("after %d of %d READs: %v", got, reads, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}
