package soft

import (
	"math/rand"
	"testing"

	"github.com/krcore/krcore/verbs"
)

// TestSQWindowMatchesSum: the bytes in flight windowFull keeps as requests
// go out and complete equal, after any run of posts, transmissions,
// completions, rewinds (an RNR NAK resends), flushes and resets, the sum
// over the send queue's requests in flight it replaced: READ bytes apart
// from WRITE and SEND bytes, atomics counting nothing.
func TestSQWindowMatchesSum(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	ops := []verbs.Opcode{verbs.OpRead, verbs.OpWrite, verbs.OpSend, verbs.OpFetchAdd, verbs.OpCompareSwap}
	q := &qp{sq: make([]wqe, 16)}
	n := uint64(len(q.sq))
	for step := 0; step < 200000; step++ {
		switch r := rng.Intn(100); {
		case r < 35 && q.posted-q.done < n:
			w := &q.sq[q.posted%n]
			w.wr = verbs.SendWR{Op: ops[rng.Intn(len(ops))], SGL: []verbs.SGE{{Length: uint32(rng.Intn(1 << 16))}}}
			q.posted++
		case r < 65 && q.sent < q.posted:
			q.sent++
		case r < 90 && q.done < q.sent:
			q.done += 1 + uint64(rng.Int63n(int64(q.sent-q.done)))
		case r < 96 && q.done < q.sent:
			q.sent = q.done + uint64(rng.Int63n(int64(q.sent-q.done)))
		case r < 98:
			q.done, q.sent = q.posted, q.posted
		case r < 99:
			clear(q.sq)
			q.done, q.sent, q.posted = 0, 0, 0
			q.sqGen.Add(1)
		}
		if rng.Intn(3) != 0 {
			continue // several changes between two looks, as between pumps
		}
		var want [2]uint64
		for i := q.done; i < q.sent; i++ {
			x := &q.sq[i%n]
			if x.wr.Op.IsAtomic() {
				continue
			}
			k := 0
			if x.wr.Op == verbs.OpRead {
				k = 1
			}
			want[k] += uint64(x.wr.Len())
		}
		if got := q.win.inFlight(q); got != want {
			t.Fatalf("step %d: done %d sent %d posted %d: in flight %v, want %v", step, q.done, q.sent, q.posted, got, want)
		}
	}
}
