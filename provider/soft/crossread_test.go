package soft_test

import (
	"bytes"
	"context"
	"fmt"
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

// TestTCPManyLargeReads: both nodes keep 128 READs of 64 KiB in flight to
// each other over TCP, more than the sockets hold, so each link's reader
// queues the responses it cannot write at once and the drain writes them;
// every READ's bytes must be the block it asked for.
func TestTCPManyLargeReads(t *testing.T) {
	const msg, blocks, depth, reads = 64 << 10, 64, 128, 1024
	const land = blocks * msg // the landing slots follow the source blocks
	// A retry timeout for a starved machine: at load 20 the first READ of
	// such a run has taken up to half a second, and at nice 19 beside
	// busy loops (load ~22) none of either side's first 128 was answered
	// within 10 s (the process, and its retry sweep, went without a CPU
	// for over a second at a time). The test is of the link's liveness,
	// not of timeouts.
	a, b := tcpNodesRetry(t, time.Minute)
	x, y := newSide(t, a, land+depth*msg), newSide(t, b, land+depth*msg)
	for _, s := range []*side{x, y} {
		if err := verbs.Connect(s.qp, other(s, x, y).qp.Endpoint(), verbs.Path{}); err != nil {
			t.Fatal(err)
		}
		src := s.mr.Bytes()[:land]
		for i := range src {
			src[i] = byte(i/msg*31 + i + int(s.mr.RKey()))
		}
	}
	var wg sync.WaitGroup
	for _, s := range []*side{x, y} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := readBlocks(s, other(s, x, y), msg, blocks, depth, reads); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

func other(s, x, y *side) *side {
	if s == x {
		return y
	}
	return x
}

// readBlocks READs reads blocks of msg bytes from to's first blocks blocks
// into from's depth landing slots, which follow them, with up to depth in
// flight, and checks each READ's bytes when it completes (in order, so
// its slot is not reused before).
func readBlocks(from, to *side, msg, blocks, depth, reads int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang's bound
	defer cancel()
	land := blocks * msg
	block := func(i int) int { return i * 7 % blocks }
	var wc [32]verbs.WC
	posted, done := 0, 0
	for done < reads {
		for posted < reads && posted-done < depth {
			wr := verbs.SendWR{ID: uint64(posted), Op: verbs.OpRead, Flags: verbs.Signaled,
				SGL:        []verbs.SGE{verbs.SGEOf(from.mr, land+posted%depth*msg, msg)},
				RemoteAddr: to.mr.Addr() + uint64(block(posted)*msg), RKey: to.mr.RKey()}
			if _, err := from.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				return err
			}
			posted++
		}
		k, err := from.cq.Poll(wc[:])
		if err != nil {
			return err
		}
		for _, c := range wc[:k] {
			i := int(c.ID)
			if c.Status != verbs.Success || i != done || c.ByteLen != uint32(msg) {
				return fmt.Errorf("completion %+v, want READ %d of %d B", c, done, msg)
			}
			got := from.mr.Bytes()[land+i%depth*msg:][:msg]
			want := to.mr.Bytes()[block(i)*msg:][:msg]
			if !bytes.Equal(got, want) {
				return fmt.Errorf("READ %d: the bytes landed are not block %d's", i, block(i))
			}
			done++
		}
		if k == 0 {
			if err := from.cq.Wait(ctx); err != nil {
				return fmt.Errorf("after %d of %d READs: %w", done, reads, err)
			}
		}
	}
	return nil
}
