package soft_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/bounded"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// hostileObjs are a node's objects of every kind, ready to use.
type hostileObjs struct {
	n   *soft.Node
	pd  verbs.PD
	cq  verbs.CQ
	mr  verbs.MR
	srq verbs.SRQ
	rc  verbs.QP
	ud  verbs.QP
	ah  verbs.AH
	blk *offheap.Block
}

func newHostileObjs(t *testing.T, fab *soft.Fabric) *hostileObjs {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	o := &hostileObjs{}
	var err error
	o.n, err = fab.NewNode(soft.Config{RetryTimeout: 100 * time.Millisecond})
	must(err)
	o.blk, err = offheap.Alloc(1 << 16)
	must(err)
	t.Cleanup(func() { o.n.Close(); o.blk.Close() })
	o.pd, err = o.n.AllocPD()
	must(err)
	o.cq, err = o.n.CreateCQ(64)
	must(err)
	o.mr, err = o.pd.RegMR(o.blk.Bytes(), verbs.AccessAll)
	must(err)
	o.srq, err = o.pd.CreateSRQ(verbs.SRQInit{MaxWR: 8, MaxSGE: 1})
	must(err)
	o.rc, err = o.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: o.cq, RecvCQ: o.cq, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 64}})
	must(err)
	must(verbs.Connect(o.rc, o.rc.Endpoint(), verbs.Path{}))
	o.ud, err = o.pd.CreateQP(verbs.QPInit{Type: verbs.UD, SendCQ: o.cq, RecvCQ: o.cq, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(err)
	must(verbs.Ready(o.ud, verbs.Path{}))
	o.ah, err = o.pd.CreateAH(verbs.AHAttr{Dest: o.ud.Endpoint()})
	must(err)
	return o
}

// calls are every method of every object of o that can fail.
func (o *hostileObjs) calls() map[string]func() error {
	sge := []verbs.SGE{verbs.SGEOf(o.mr, 0, 64)}
	return map[string]func() error{
		"Node.AllocPD":  func() error { _, err := o.n.AllocPD(); return err },
		"Node.CreateCQ": func() error { _, err := o.n.CreateCQ(8); return err },
		"PD.RegMR":      func() error { _, err := o.pd.RegMR(o.blk.Bytes()[:4096], verbs.AccessAll); return err },
		"PD.CreateQP": func() error {
			_, err := o.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: o.cq, RecvCQ: o.cq})
			return err
		},
		"PD.CreateSRQ": func() error { _, err := o.pd.CreateSRQ(verbs.SRQInit{MaxWR: 4, MaxSGE: 1}); return err },
		"PD.CreateAH":  func() error { _, err := o.pd.CreateAH(verbs.AHAttr{Dest: o.ud.Endpoint()}); return err },
		"CQ.Poll":      func() error { _, err := o.cq.Poll(make([]verbs.WC, 4)); return err },
		"CQ.Wait": func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return o.cq.Wait(ctx)
		},
		"QP.Modify": func() error { return o.rc.Modify(verbs.QPAttr{State: verbs.StateErr}) },
		"QP.PostSend": func() error {
			_, err := o.rc.PostSend([]verbs.SendWR{{Op: verbs.OpWrite, SGL: sge, RemoteAddr: o.mr.Addr(), RKey: o.mr.RKey()}})
			return err
		},
		"QP.PostRecv":  func() error { _, err := o.rc.PostRecv([]verbs.RecvWR{{SGL: sge}}); return err },
		"SRQ.PostRecv": func() error { _, err := o.srq.PostRecv([]verbs.RecvWR{{SGL: sge}}); return err },
		"UD.PostSend": func() error {
			_, err := o.ud.PostSend([]verbs.SendWR{{Op: verbs.OpSend, SGL: sge, AH: o.ah, RemoteQPN: o.ud.Num()}})
			return err
		},
	}
}

// TestHostileUseAfterNodeClose calls every method of every object after
// its node closed: each fails with ErrClosed within a bound, never panics.
func TestHostileUseAfterNodeClose(t *testing.T) {
	o := newHostileObjs(t, soft.NewFabric())
	if err := o.n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := o.n.Close(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
	for name, f := range o.calls() {
		t.Run(name, func(t *testing.T) {
			if err := bounded.Within(t, 3*time.Second, name, f); !errors.Is(err, verbs.ErrClosed) {
				t.Errorf("%s after the node closed: %v, want ErrClosed", name, err)
			}
		})
	}
}

// TestHostileVerbsArgs hands the soft RNIC's calls bad arguments: each is
// an error matching ErrInvalid or ErrLimit (or, for a wrong state,
// ErrQPState), never a panic, and the node still works afterwards.
func TestHostileVerbsArgs(t *testing.T) {
	fab := soft.NewFabric()
	o := newHostileObjs(t, fab)
	other := newHostileObjs(t, fab)
	good := verbs.SGEOf(o.mr, 0, 64)
	post := func(wr verbs.SendWR) func() error {
		return func() error { _, err := o.rc.PostSend([]verbs.SendWR{wr}); return err }
	}
	cases := map[string]func() error{
		"CreateCQ -1":       func() error { _, err := o.n.CreateCQ(-1); return err },
		"CreateCQ 0":        func() error { _, err := o.n.CreateCQ(0); return err },
		"CreateCQ MaxInt":   func() error { _, err := o.n.CreateCQ(math.MaxInt); return err },
		"RegMR nil":         func() error { _, err := o.pd.RegMR(nil, verbs.AccessAll); return err },
		"RegMR heap":        func() error { _, err := o.pd.RegMR(make([]byte, 64), verbs.AccessAll); return err },
		"RegMR bad access":  func() error { _, err := o.pd.RegMR(o.blk.Bytes()[:64], verbs.Access(1<<31)); return err },
		"CreateQP nil CQs":  func() error { _, err := o.pd.CreateQP(verbs.QPInit{Type: verbs.RC}); return err },
		"CreateQP bad type": func() error { _, err := o.pd.CreateQP(verbs.QPInit{Type: 99, SendCQ: o.cq, RecvCQ: o.cq}); return err },
		"CreateQP huge cap": func() error {
			_, err := o.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: o.cq, RecvCQ: o.cq, Cap: verbs.QPCap{MaxSendWR: math.MaxInt}})
			return err
		},
		"CreateQP negative": func() error {
			_, err := o.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: o.cq, RecvCQ: o.cq, Cap: verbs.QPCap{MaxSendWR: -1}})
			return err
		},
		"CreateQP foreign CQ": func() error {
			_, err := o.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: other.cq, RecvCQ: other.cq})
			return err
		},
		"CreateQP foreign SRQ": func() error {
			_, err := o.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: o.cq, RecvCQ: o.cq, SRQ: other.srq})
			return err
		},
		"CreateSRQ 0":    func() error { _, err := o.pd.CreateSRQ(verbs.SRQInit{}); return err },
		"CreateSRQ -1":   func() error { _, err := o.pd.CreateSRQ(verbs.SRQInit{MaxWR: -1, MaxSGE: 1}); return err },
		"CreateAH empty": func() error { _, err := o.pd.CreateAH(verbs.AHAttr{}); return err },
		"Modify RESET->RTS": func() error {
			q, _ := o.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: o.cq, RecvCQ: o.cq})
			return q.Modify(verbs.QPAttr{State: verbs.StateRTS})
		},
		"Modify bad state":    func() error { return o.rc.Modify(verbs.QPAttr{State: 99}) },
		"PostSend none":       func() error { _, err := o.rc.PostSend(nil); return err },
		"PostSend bad opcode": post(verbs.SendWR{Op: 0, SGL: []verbs.SGE{good}}),
		"PostSend opcode 200": post(verbs.SendWR{Op: 200, SGL: []verbs.SGE{good}}),
		"PostSend too many SGEs": post(verbs.SendWR{Op: verbs.OpWrite, SGL: []verbs.SGE{good, good, good},
			RemoteAddr: o.mr.Addr(), RKey: o.mr.RKey()}),
		"PostSend inline at MaxUint64": post(verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Inline, SGL: []verbs.SGE{{Addr: math.MaxUint64 - 15, Length: 8}},
			RemoteAddr: o.mr.Addr(), RKey: o.mr.RKey()}),
		"PostSend inline 2^63 past": post(verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Inline, SGL: []verbs.SGE{{Addr: o.mr.Addr() + 1<<63, Length: 8}},
			RemoteAddr: o.mr.Addr(), RKey: o.mr.RKey()}),
		"PostSend UD no AH": func() error {
			_, err := o.ud.PostSend([]verbs.SendWR{{Op: verbs.OpSend, SGL: []verbs.SGE{good}}})
			return err
		},
		"PostSend UD foreign AH": func() error {
			_, err := o.ud.PostSend([]verbs.SendWR{{Op: verbs.OpSend, SGL: []verbs.SGE{good}, AH: other.ah}})
			return err
		},
		"PostSend UD READ": func() error {
			_, err := o.ud.PostSend([]verbs.SendWR{{Op: verbs.OpRead, SGL: []verbs.SGE{good}, AH: o.ah}})
			return err
		},
		"PostRecv none":          func() error { _, err := o.rc.PostRecv(nil); return err },
		"PostRecv too many SGEs": func() error { _, err := o.rc.PostRecv([]verbs.RecvWR{{SGL: []verbs.SGE{good, good}}}); return err },
		"SRQ PostRecv 2 SGEs":    func() error { _, err := o.srq.PostRecv([]verbs.RecvWR{{SGL: []verbs.SGE{good, good}}}); return err },
		"Poll none":              func() error { n, err := o.cq.Poll(nil); _ = n; return errOrNil(err, n != 0) },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("panic: %v", p)
				}
			}()
			err := bounded.Within(t, 3*time.Second, name, f)
			if name == "Poll none" || name == "PostSend none" || name == "PostRecv none" {
				if err != nil && !errors.Is(err, verbs.ErrInvalid) {
					t.Errorf("%s: %v", name, err)
				}
				return
			}
			if !errors.Is(err, verbs.ErrInvalid) && !errors.Is(err, verbs.ErrLimit) && !errors.Is(err, verbs.ErrQPState) {
				t.Errorf("%s: %v, want ErrInvalid, ErrLimit or ErrQPState", name, err)
			}
		})
	}
	// The node still carries a WRITE on its loopback RC QP.
	copy(o.blk.Bytes(), "loop")
	if _, err := o.rc.PostSend([]verbs.SendWR{{ID: 7, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(o.mr, 0, 4)},
		RemoteAddr: o.mr.Addr() + 100, RKey: o.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]verbs.WC, 1)
	for {
		if n, err := o.cq.Poll(wc); err != nil || n == 1 {
			if err != nil || wc[0].Status != verbs.Success || string(o.blk.Bytes()[100:104]) != "loop" {
				t.Fatalf("WRITE after the bad calls: %v %+v", err, wc[0])
			}
			break
		}
		if err := o.cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func errOrNil(err error, bad bool) error {
	if bad {
		return errors.New("returned completions from an empty slice")
	}
	return err
}

// TestHostileSameListen starts two nodes on one TCP address: the second
// fails with ErrAddrInUse at once, the first keeps serving. The first
// binds a port the kernel picks: a port picked by a probe listener and
// freed for the node could be taken meanwhile by any process on the
// machine.
func TestHostileSameListen(t *testing.T) {
	fab := soft.NewFabric()
	first, err := fab.NewNode(soft.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	addr := first.Addr()
	for name, f := range map[string]*soft.Fabric{"same fabric": fab, "another fabric": soft.NewFabric()} {
		var dup *soft.Node
		err := bounded.Within(t, 5*time.Second, name, func() error {
			var err error
			dup, err = f.NewNode(soft.Config{Listen: addr})
			return err
		})
		if err == nil {
			dup.Close()
			t.Errorf("%s: a second node listens on %s", name, addr)
		} else if !errors.Is(err, soft.ErrAddrInUse) {
			t.Errorf("%s: %v, want ErrAddrInUse", name, err)
		}
	}
	if !first.Port().Active {
		t.Error("the first node was closed by the refused second one")
	}
}
