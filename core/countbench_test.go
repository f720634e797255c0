package core_test

import (
	"context"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// BenchmarkRead8Loop is BenchmarkRead8's vq-dc, raw and raw-dc with
// nothing in the timed loop but the requests (rawRead8 reads the clock
// three times a request, the VQ loop never), each loop a function of its
// own so that callgrind can count one loop's instructions alone:
//
//	go test -c -o core.test ./core/
//	valgrind --tool=callgrind --collect-atstart=no \
//	  --toggle-collect='*read8VQLoop' ./core.test -test.run XXX \
//	  -test.bench 'Read8Loop/vq-dc$' -test.benchtime 20000x
//
// (read8RawLoop for raw and raw-dc); the total over 20000 is a request's
// instruction count, which the machine's load does not move.
func BenchmarkRead8Loop(b *testing.B) {
	b.Run("vq-dc", func(b *testing.B) {
		c := benchCluster(b)
		q, req := vqReader(b, c.Node(1), c.Node(2))
		reportCPU(b)
		b.ResetTimer()
		read8VQLoop(b, q, req)
	})
	raw := func(pair func(*testing.B, verbs.Device, verbs.Device) (rawSide, rawSide)) func(*testing.B) {
		return func(b *testing.B) {
			c := benchCluster(b)
			x, y := pair(b, c.Devices[0], c.Devices[1])
			wr := []verbs.SendWR{{Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 8)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}}
			if x.dc != nil {
				wr[0].AH, wr[0].RemoteQPN, wr[0].DCKey = x.dc.AH, x.dc.RemoteQPN, x.dc.DCKey
			}
			reportCPU(b)
			b.ResetTimer()
			read8RawLoop(b, x, wr)
		}
	}
	b.Run("raw", raw(rawPair))
	b.Run("raw-dc", raw(rawDCPair))
}

// read8VQLoop pushes req and pops its completion, b.N times.
//
//go:noinline
func read8VQLoop(b *testing.B, q *core.Queue, req krcore.Request) {
	ctx := context.Background()
	var out [1]krcore.Completion
	for i := 0; i < b.N; i++ {
		if err := q.PushOne(ctx, false, req); err != nil {
			b.Fatal(err)
		}
		for q.Pop(out[:]) == 0 {
		}
		if out[0].Status != verbs.Success {
			b.Fatal(out[0].Status)
		}
	}
}

// read8RawLoop posts wr on x's QP and polls its completion, b.N times.
//
//go:noinline
func read8RawLoop(b *testing.B, x rawSide, wr []verbs.SendWR) {
	var wc [1]verbs.WC
	for i := 0; i < b.N; i++ {
		if _, err := x.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for {
			n, err := x.cq.Poll(wc[:])
			if err != nil {
				b.Fatal(err)
			}
			if n > 0 {
				break
			}
		}
		if wc[0].Status != verbs.Success {
			b.Fatal(wc[0].Status)
		}
	}
}

// BenchmarkRead8StreamLoop is krbench's message-rate loop (vqrun.Stream,
// rawqp's Stream) for callgrind: up to 64 8 B READs in flight (krbench
// keeps 128; rawPair's QPs hold 64), one in 32 signaled, through a VQ on
// its DCI and a raw RC QP; an op is one request. Count it as BenchmarkRead8Loop, toggling read8VQStream or
// read8RawStream.
func BenchmarkRead8StreamLoop(b *testing.B) {
	const depth, cqMod = 64, 32
	b.Run("vq-dc", func(b *testing.B) {
		c := benchCluster(b)
		q, req := vqReader(b, c.Node(1), c.Node(2))
		reportCPU(b)
		b.ResetTimer()
		read8VQStream(b, q, req, depth, cqMod)
	})
	b.Run("raw", func(b *testing.B) {
		c := benchCluster(b)
		x, y := rawPair(b, c.Devices[0], c.Devices[1])
		wrs := make([]verbs.SendWR, depth)
		for i := range wrs {
			wrs[i] = verbs.SendWR{Op: verbs.OpRead, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 8)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}
		}
		reportCPU(b)
		b.ResetTimer()
		read8RawStream(b, x, wrs, cqMod)
	})
}

// read8VQStream keeps up to depth READs like req in flight on q until b.N
// have completed, one in cqMod signaled.
//
//go:noinline
func read8VQStream(b *testing.B, q *core.Queue, req krcore.Request, depth, cqMod int) {
	ctx := context.Background()
	reqs := make([]krcore.Request, depth)
	var out [64]krcore.Completion
	posted, done := 0, 0
	for done < b.N {
		if room := min(depth-(posted-done), b.N-posted); room > 0 {
			batch := reqs[:room]
			for k := range batch {
				seq := posted + k
				batch[k] = req
				batch[k].ID = uint64(seq)
				batch[k].Unsignaled = (seq+1)%cqMod != 0 && seq+1 != b.N
			}
			n, err := q.Push(ctx, false, batch...)
			if err != nil {
				b.Fatal(err)
			}
			posted += n
		}
		n := q.Pop(out[:])
		for _, c := range out[:n] {
			if c.Status != verbs.Success {
				b.Fatal(c.Status)
			}
			done = int(c.ID) + 1
		}
	}
}

// read8RawStream is read8VQStream on x's raw QP, its work requests in wrs
// (len(wrs) the depth).
//
//go:noinline
func read8RawStream(b *testing.B, x rawSide, wrs []verbs.SendWR, cqMod int) {
	var wc [64]verbs.WC
	posted, done := 0, 0
	for done < b.N {
		if room := min(len(wrs)-(posted-done), b.N-posted); room > 0 {
			batch := wrs[:room]
			for k := range batch {
				seq := posted + k
				batch[k].ID = uint64(seq)
				batch[k].Flags = 0
				if (seq+1)%cqMod == 0 || seq+1 == b.N {
					batch[k].Flags = verbs.Signaled
				}
			}
			if _, err := x.qp.PostSend(batch); err != nil {
				b.Fatal(err)
			}
			posted += room
		}
		n, err := x.cq.Poll(wc[:])
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range wc[:n] {
			if c.Status != verbs.Success {
				b.Fatal(c.Status)
			}
			done = int(c.ID) + 1
		}
	}
}
