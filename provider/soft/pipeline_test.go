package soft_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// TestNoExecutionBehindError: requests pipelined behind one that fails at
// the target are flushed and never executed there, on RC and DC, so a
// runtime can repost them without running them twice.
func TestNoExecutionBehindError(t *testing.T) {
	for name, mk := range pairs(t) {
		t.Run(name, func(t *testing.T) {
			a, b := mk(t)
			// Target: a DCT with a counter MR; and an RC pair.
			// Not a test of timeouts: the patient path keeps a starved
			// run (nice 19 beside busy loops) from timing the requests
			// out before the failed one is answered.
			x, y := connectPairPath(t, a, b, 4096, patientPath)
			pdB := y.pd
			srq, err := pdB.CreateSRQ(verbs.SRQInit{MaxWR: 4, MaxSGE: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer srq.Close()
			dct, err := pdB.CreateQP(verbs.QPInit{Type: verbs.DCT, SendCQ: y.cq, RecvCQ: y.cq, SRQ: srq, DCKey: 77})
			if err == nil {
				err = verbs.Ready(dct, verbs.Path{})
			}
			if err != nil {
				t.Fatal(err)
			}
			defer dct.Close()
			dci, err := x.pd.CreateQP(verbs.QPInit{Type: verbs.DCI, SendCQ: x.cq, RecvCQ: x.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxSendSGE: 1}})
			if err != nil {
				t.Fatal(err)
			}
			defer dci.Close()
			if err := verbs.Ready(dci, patientPath); err != nil {
				t.Fatal(err)
			}
			ah, err := x.pd.CreateAH(verbs.AHAttr{Dest: dct.Endpoint()})
			if err != nil {
				t.Fatal(err)
			}
			defer ah.Close()
			blk, _ := offheap.Alloc(64)
			defer blk.Close()
			counter := y.mr.Bytes()[64:72]
			for _, qp := range []verbs.QP{x.qp, dci} {
				binary.LittleEndian.PutUint64(counter, 0)
				bad := verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 8)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey() ^ 0x5a5a}
				faa := verbs.SendWR{ID: 2, Op: verbs.OpFetchAdd, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 8, 8)}, RemoteAddr: y.mr.Addr() + 64, RKey: y.mr.RKey(), CompareAdd: 1}
				if qp == dci {
					for _, wr := range []*verbs.SendWR{&bad, &faa} {
						wr.AH, wr.RemoteQPN, wr.DCKey = ah, dct.Num(), 77
					}
				}
				if _, err := qp.PostSend([]verbs.SendWR{bad, faa, faa, faa}); err != nil {
					t.Fatal(err)
				}
				if wc := waitWC(t, x.cq); wc.Status != verbs.RemAccessErr {
					t.Fatalf("%s: first completion %+v, want REM_ACCESS_ERR", qp.Type(), wc)
				}
				for i := 0; i < 3; i++ {
					if wc := waitWC(t, x.cq); wc.Status != verbs.WRFlushErr {
						t.Fatalf("%s: completion %+v, want WR_FLUSH_ERR", qp.Type(), wc)
					}
				}
				time.Sleep(20 * time.Millisecond) // let anything still in flight land
				if v := binary.LittleEndian.Uint64(counter); v != 0 {
					t.Fatalf("%s: %d fetch-and-adds ran behind the failed request", qp.Type(), v)
				}
			}
		})
	}
}
