package soft_test

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// side is one end of a connected RC pair.
type side struct {
	dev verbs.Device
	pd  verbs.PD
	cq  verbs.CQ
	qp  verbs.QP
	mr  verbs.MR
}

func newSide(t testing.TB, dev verbs.Device, size int) *side {
	t.Helper()
	s := &side{dev: dev}
	var err error
	must := func(e error) {
		t.Helper()
		if e != nil {
			t.Fatal(e)
		}
	}
	s.pd, err = dev.AllocPD()
	must(err)
	s.cq, err = dev.CreateCQ(1024)
	must(err)
	s.qp, err = s.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq, Cap: verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInline: 64}})
	must(err)
	// memfd memory: on a shared-memory link, READs and WRITEs to it go
	// in place (shmplace.go).
	blk, err := offheap.AllocShared("soft-test", size)
	must(err)
	s.mr, err = s.pd.RegMR(blk.Bytes(), verbs.AccessAll)
	must(err)
	t.Cleanup(func() {
		s.qp.Close()
		s.mr.Close()
		s.cq.Close()
		s.pd.Close()
		blk.Close()
	})
	return s
}

func connectPair(t testing.TB, a, b verbs.Device, size int) (*side, *side) {
	t.Helper()
	return connectPairPath(t, a, b, size, verbs.Path{Timeout: 100 * time.Millisecond, RetryCount: 1})
}

// patientPath is a path for tests of something other than timeouts: a
// request unanswered for 8 s fails. connectPair's 200 ms is reached
// under -race on two loaded cores, where the link's goroutines wait for
// a core.
var patientPath = verbs.Path{Timeout: 2 * time.Second, RetryCount: 3}

// connectPairPath is connectPair with the QPs' path p.
func connectPairPath(t testing.TB, a, b verbs.Device, size int, p verbs.Path) (*side, *side) {
	t.Helper()
	x, y := newSide(t, a, size), newSide(t, b, size)
	if err := verbs.Connect(x.qp, y.qp.Endpoint(), p); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(y.qp, x.qp.Endpoint(), p); err != nil {
		t.Fatal(err)
	}
	return x, y
}

func waitWC(t testing.TB, cq verbs.CQ) verbs.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wc [1]verbs.WC
	for {
		n, err := cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func pairs(t *testing.T) map[string]func(t *testing.T) (verbs.Device, verbs.Device) {
	return map[string]func(t *testing.T) (verbs.Device, verbs.Device){
		"mem": func(t *testing.T) (verbs.Device, verbs.Device) {
			fab := soft.NewFabric()
			a, _ := fab.NewNode(soft.Config{RetryTimeout: 300 * time.Millisecond})
			b, _ := fab.NewNode(soft.Config{RetryTimeout: 300 * time.Millisecond})
			t.Cleanup(func() { a.Close(); b.Close() })
			return a, b
		},
		"tcp": func(t *testing.T) (verbs.Device, verbs.Device) {
			return listenPair(t, soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 300 * time.Millisecond, TCPOnly: true})
		},
		"shm": func(t *testing.T) (verbs.Device, verbs.Device) {
			return listenPair(t, soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 300 * time.Millisecond})
		},
	}
}

// listenPair starts two nodes on no common fabric, with cfg: they reach
// each other over TCP, or the shared-memory link unless cfg.TCPOnly.
func listenPair(t testing.TB, cfg soft.Config) (*soft.Node, *soft.Node) {
	t.Helper()
	a, err := soft.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := soft.NewNode(cfg)
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestReadWriteAtomicSend(t *testing.T) {
	for name, mk := range pairs(t) {
		t.Run(name, func(t *testing.T) {
			a, b := mk(t)
			x, y := connectPairPath(t, a, b, 4096, patientPath)
			copy(y.mr.Bytes()[100:], "hello, remote")
			wr := verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 13)}, RemoteAddr: y.mr.Addr() + 100, RKey: y.mr.RKey()}
			if _, err := x.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			if wc := waitWC(t, x.cq); wc.Status != verbs.Success || string(x.mr.Bytes()[:13]) != "hello, remote" {
				t.Fatalf("read: %+v %q", wc, x.mr.Bytes()[:13])
			}
			copy(x.mr.Bytes()[200:], "written")
			wr = verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 200, 7)}, RemoteAddr: y.mr.Addr() + 300, RKey: y.mr.RKey()}
			x.qp.PostSend([]verbs.SendWR{wr})
			if wc := waitWC(t, x.cq); wc.Status != verbs.Success || string(y.mr.Bytes()[300:307]) != "written" {
				t.Fatalf("write: %+v", wc)
			}
			binary.LittleEndian.PutUint64(y.mr.Bytes()[8:], 40)
			wr = verbs.SendWR{ID: 3, Op: verbs.OpFetchAdd, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 8)}, RemoteAddr: y.mr.Addr() + 8, RKey: y.mr.RKey(), CompareAdd: 2}
			x.qp.PostSend([]verbs.SendWR{wr})
			if wc := waitWC(t, x.cq); wc.Status != verbs.Success || binary.LittleEndian.Uint64(x.mr.Bytes()) != 40 || binary.LittleEndian.Uint64(y.mr.Bytes()[8:]) != 42 {
				t.Fatalf("faa: %+v", wc)
			}
			y.qp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{verbs.SGEOf(y.mr, 1000, 100)}}})
			wr = verbs.SendWR{ID: 4, Op: verbs.OpSendImm, Imm: 77, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 200, 7)}}
			x.qp.PostSend([]verbs.SendWR{wr})
			if wc := waitWC(t, x.cq); wc.Status != verbs.Success {
				t.Fatalf("send: %+v", wc)
			}
			if wc := waitWC(t, y.cq); wc.Status != verbs.Success || wc.ID != 9 || wc.Imm != 77 || !wc.HasImm || wc.ByteLen != 7 || string(y.mr.Bytes()[1000:1007]) != "written" {
				t.Fatalf("recv: %+v", wc)
			}
			// Bad rkey: REM_ACCESS_ERR then flush.
			wr = verbs.SendWR{ID: 5, Op: verbs.OpRead, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 8)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey() + 1}
			wr2 := wr
			wr2.ID, wr2.RKey = 6, y.mr.RKey()
			x.qp.PostSend([]verbs.SendWR{wr, wr2})
			wc := waitWC(t, x.cq)
			if !errors.Is(wc.Err(), verbs.RemAccessErr) || wc.ID != 5 {
				t.Fatalf("bad rkey: %+v", wc)
			}
			if wc := waitWC(t, x.cq); wc.Status != verbs.WRFlushErr || wc.ID != 6 {
				t.Fatalf("flush: %+v", wc)
			}
			if x.qp.State() != verbs.StateErr {
				t.Fatal("not in ERR")
			}
		})
	}
}

func BenchmarkRead8(b *testing.B) {
	for _, name := range []string{"mem", "shm", "tcp", "tcpwait", "tcpyield"} {
		b.Run(name, func(b *testing.B) {
			var a, c *soft.Node
			if name == "mem" {
				fab := soft.NewFabric()
				a, _ = fab.NewNode(soft.Config{})
				c, _ = fab.NewNode(soft.Config{})
			} else {
				cfg := soft.Config{Listen: "127.0.0.1:0", TCPOnly: name != "shm"}
				a, _ = soft.NewNode(cfg)
				c, _ = soft.NewNode(cfg)
			}
			defer a.Close()
			defer c.Close()
			x, y := connectPair(b, a, c, 4096)
			wr := []verbs.SendWR{{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 8)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}}
			var wc [4]verbs.WC
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := x.qp.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				for {
					if name == "tcpwait" {
						x.cq.Wait(context.Background())
					} else if name == "tcpyield" {
						runtime.Gosched()
					}
					n, err := x.cq.Poll(wc[:])
					if err != nil {
						b.Fatal(err)
					}
					if n > 0 {
						if wc[0].Status != verbs.Success {
							b.Fatal(wc[0])
						}
						break
					}
				}
			}
		})
	}
}

// TestSendSideByteLen: a successful WRITE, WRITE_WITH_IMM and SEND report
// the bytes they moved in ByteLen, whether acknowledged one by one or by
// a later cumulative ACK (a batch of WRITEs over TCP), and inline or not.
func TestSendSideByteLen(t *testing.T) {
	for name, mk := range pairs(t) {
		t.Run(name, func(t *testing.T) {
			a, b := mk(t)
			x, y := connectPair(t, a, b, 8192)
			if _, err := y.qp.PostRecv([]verbs.RecvWR{{ID: 100, SGL: []verbs.SGE{verbs.SGEOf(y.mr, 4096, 1024)}}, {ID: 101, SGL: []verbs.SGE{verbs.SGEOf(y.mr, 5120, 1024)}}}); err != nil {
				t.Fatal(err)
			}
			var wrs []verbs.SendWR
			want := map[uint64]uint32{}
			for i := range 16 {
				n := 10 * (i + 1)
				wr := verbs.SendWR{ID: uint64(i + 1), Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, n)}, RemoteAddr: y.mr.Addr() + uint64(i*256), RKey: y.mr.RKey()}
				if i%2 == 1 && n <= 64 { // 20, 40 and 60 B go inline (MaxInline 64)
					wr.Flags |= verbs.Inline
				}
				wrs, want[wr.ID] = append(wrs, wr), uint32(n)
			}
			wrs = append(wrs,
				verbs.SendWR{ID: 17, Op: verbs.OpWriteImm, Flags: verbs.Signaled, Imm: 7, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 33)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()},
				verbs.SendWR{ID: 18, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 20), verbs.SGEOf(x.mr, 100, 21)}})
			want[17], want[18] = 33, 41
			if _, err := x.qp.PostSend(wrs); err != nil {
				t.Fatal(err)
			}
			for range wrs {
				wc := waitWC(t, x.cq)
				if wc.Status != verbs.Success || wc.ByteLen != want[wc.ID] {
					t.Errorf("WR %d (%s): status %s, ByteLen %d, want SUCCESS and %d", wc.ID, wc.Op, wc.Status, wc.ByteLen, want[wc.ID])
				}
			}
		})
	}
}
