package soft_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// udPort is a UD QP ready to send and receive, with one MR for both.
type udPort struct {
	qp verbs.QP
	cq verbs.CQ
	mr verbs.MR
}

func newUDPort(t *testing.T, dev verbs.Device) *udPort {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	u := &udPort{}
	if u.cq, err = dev.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if u.qp, err = pd.CreateQP(verbs.QPInit{Type: verbs.UD, SendCQ: u.cq, RecvCQ: u.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	blk, err := offheap.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if u.mr, err = pd.RegMR(blk.Bytes(), verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Ready(u.qp, verbs.Path{QKey: 7}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.qp.Close(); u.mr.Close(); u.cq.Close(); pd.Close(); blk.Close() })
	return u
}

// TestUDToUnreachablePort: a datagram to a node that is gone is lost on
// the wire at once; it never holds the datagrams posted behind it to a
// live node (until the retry timeout), nor moves the QP to ERR.
func TestUDToUnreachablePort(t *testing.T) {
	for name, mk := range map[string]func(t *testing.T) (a, b, dead verbs.Device){
		"mem": func(t *testing.T) (a, b, dead verbs.Device) {
			fab := soft.NewFabric()
			var ds [3]verbs.Device
			for i := range ds {
				n, err := fab.NewNode(soft.Config{RetryTimeout: 2 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { n.Close() })
				ds[i] = n
			}
			return ds[0], ds[1], ds[2]
		},
		"tcp": func(t *testing.T) (a, b, dead verbs.Device) {
			var ds [3]verbs.Device
			for i := range ds {
				n, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 2 * time.Second, TCPOnly: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { n.Close() })
				ds[i] = n
			}
			return ds[0], ds[1], ds[2]
		},
	} {
		t.Run(name, func(t *testing.T) {
			a, b, dead := mk(t)
			ua, ub := newUDPort(t, a), newUDPort(t, b)
			pd, _ := a.AllocPD()
			defer pd.Close()
			deadEP := verbs.Endpoint{Addr: dead.Port().Addr, GID: dead.Port().GID, LID: dead.Port().LID, QPN: 1}
			toDead, err := pd.CreateAH(verbs.AHAttr{Dest: deadEP})
			if err != nil {
				t.Fatal(err)
			}
			defer toDead.Close()
			toB, err := pd.CreateAH(verbs.AHAttr{Dest: ub.qp.Endpoint()})
			if err != nil {
				t.Fatal(err)
			}
			defer toB.Close()
			dead.Close()
			if _, err := ub.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{verbs.SGEOf(ub.mr, 0, 1024)}}}); err != nil {
				t.Fatal(err)
			}
			wr := func(id uint64, ah verbs.AH, qpn uint32) verbs.SendWR {
				return verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(ua.mr, 0, 8)},
					AH: ah, RemoteQPN: qpn, QKey: 7}
			}
			t0 := time.Now()
			if _, err := ua.qp.PostSend([]verbs.SendWR{wr(1, toDead, 1), wr(2, toB, ub.qp.Num())}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			got := waitWCs(ctx, t, ub.cq, 1)
			if got[0].Status != verbs.Success || got[0].ID != 1 {
				t.Fatalf("live node's receive: %+v", got[0])
			}
			if d := time.Since(t0); d > time.Second {
				t.Errorf("the datagram to a live node came %v after one to a dead node (retry timeout 2s)", d)
			}
			for i, wc := range waitWCs(ctx, t, ua.cq, 2) {
				if wc.Status != verbs.Success || wc.ID != uint64(i+1) {
					t.Errorf("send %d: %+v, want SUCCESS (UD has no acknowledgement)", i+1, wc)
				}
			}
			if st := ua.qp.State(); st != verbs.StateRTS {
				t.Errorf("sender QP is %v after a datagram to a dead node, want RTS", st)
			}
		})
	}
}

// waitWCs waits for n completions on cq.
func waitWCs(ctx context.Context, t *testing.T, cq verbs.CQ, n int) []verbs.WC {
	t.Helper()
	var out []verbs.WC
	wcs := make([]verbs.WC, n)
	for len(out) < n {
		k, err := cq.Poll(wcs[:n-len(out)])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, wcs[:k]...)
		if len(out) < n {
			if err := cq.Wait(ctx); err != nil {
				t.Fatalf("%d of %d completions: %v", len(out), n, err)
			}
		}
	}
	return out
}

// TestUDToSlowLink: a datagram whose TCP link does not come up within the
// QP's timeout (the peer accepts but never completes the handshake) is
// lost, as on any fabric; the datagrams behind it to a live node go on and
// the QP stays RTS. Failing the QP instead flushed its receives, so a
// control QP that only answers went deaf for good.
func TestUDToSlowLink(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // never answers the hello
		}
	}()
	defer func() {
		ln.Close()
		<-accepted
		for _, c := range held {
			c.Close()
		}
	}()
	var ds [2]verbs.Device
	for i := range ds {
		n, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 100 * time.Millisecond, DialTimeout: 10 * time.Second, TCPOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		ds[i] = n
	}
	ua, ub := newUDPort(t, ds[0]), newUDPort(t, ds[1])
	pd, _ := ds[0].AllocPD()
	defer pd.Close()
	toSlow, err := pd.CreateAH(verbs.AHAttr{Dest: verbs.Endpoint{Addr: ln.Addr().String(), QPN: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer toSlow.Close()
	toB, err := pd.CreateAH(verbs.AHAttr{Dest: ub.qp.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer toB.Close()
	if _, err := ub.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{verbs.SGEOf(ub.mr, 0, 1024)}}}); err != nil {
		t.Fatal(err)
	}
	wr := func(id uint64, ah verbs.AH, qpn uint32) verbs.SendWR {
		return verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(ua.mr, 0, 8)},
			AH: ah, RemoteQPN: qpn, QKey: 7}
	}
	if _, err := ua.qp.PostSend([]verbs.SendWR{wr(1, toSlow, 1), wr(2, toB, ub.qp.Num())}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, wc := range waitWCs(ctx, t, ua.cq, 2) {
		if wc.Status != verbs.Success || wc.ID != uint64(i+1) {
			t.Errorf("send %d: %+v, want SUCCESS (UD has no acknowledgement)", i+1, wc)
		}
	}
	if got := waitWCs(ctx, t, ub.cq, 1); got[0].Status != verbs.Success || got[0].ID != 1 {
		t.Errorf("live node's receive: %+v", got[0])
	}
	if st := ua.qp.State(); st != verbs.StateRTS {
		t.Errorf("sender QP is %v after a datagram to a node whose link did not come up, want RTS", st)
	}
}
