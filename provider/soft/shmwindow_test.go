package soft_test

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestShmDeepWindow: 128 64 KiB READs or WRITEs in flight, far more than
// a ring holds, all complete (the responder's reader queues what does not
// fit and moves it as the requester makes room).
func TestShmDeepWindow(t *testing.T) {
	for _, op := range []verbs.Opcode{verbs.OpRead, verbs.OpWrite} {
		a, b := listenPair(t, soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 3 * time.Second})
		x, y := newSide(t, a, 128<<16), newSide(t, b, 128<<16)
		p := verbs.Path{Timeout: 1000 * time.Millisecond, RetryCount: 2}
		if err := verbs.Connect(x.qp, y.qp.Endpoint(), p); err != nil {
			t.Fatal(err)
		}
		if err := verbs.Connect(y.qp, x.qp.Endpoint(), p); err != nil {
			t.Fatal(err)
		}
		const total = 2000
		var wc [32]verbs.WC
		out, done := 0, 0
		start := time.Now()
		for i := 0; done < total; {
			for ; out < 128 && i < total; out++ {
				off := (i % 128) << 16
				wr := verbs.SendWR{ID: uint64(i), Op: op, SGL: []verbs.SGE{verbs.SGEOf(x.mr, off, 1<<16)}, RemoteAddr: y.mr.Addr() + uint64(off), RKey: y.mr.RKey()}
				if i%32 == 31 || i == total-1 {
					wr.Flags = verbs.Signaled
				}
				if _, err := x.qp.PostSend([]verbs.SendWR{wr}); err != nil {
					t.Fatal(err)
				}
				i++
			}
			k, err := x.cq.Poll(wc[:])
			if err != nil {
				t.Fatal(err)
			}
			if k == 0 {
				x.cq.Wait(context.Background())
			}
			for _, c := range wc[:k] {
				if c.Status != verbs.Success {
					t.Fatalf("%v %d: %v", op, c.ID, c.Status)
				}
				n := int(c.ID) + 1 - done
				done += n
				out -= n
			}
		}
		t.Logf("%v: %.0f MB/s", op, float64(total<<16)/time.Since(start).Seconds()/1e6)
	}
}
