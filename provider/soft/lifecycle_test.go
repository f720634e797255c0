package soft_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestNoLeaks registers and deregisters 10,000 MRs and creates and destroys
// 10,000 QPs: the heap must not grow and the node must count nothing live.
func TestNoLeaks(t *testing.T) {
	n, err := soft.NewFabric().NewNode(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	pd, _ := n.AllocPD()
	cq, _ := n.CreateCQ(16)
	blk, err := offheap.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer blk.Close()
	churn := func() {
		for i := 0; i < 10000; i++ {
			mr, err := pd.RegMR(blk.Bytes()[i%1000:], verbs.AccessAll)
			if err != nil {
				t.Fatal(err)
			}
			if err := mr.Close(); err != nil {
				t.Fatal(err)
			}
			qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64}})
			if err != nil {
				t.Fatal(err)
			}
			if err := qp.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	churn() // warm up maps and pools
	before := heapInUse()
	churn()
	after := heapInUse()
	t.Logf("heap before %d B, after %d B (10,000 MRs and 10,000 QPs)", before, after)
	if after > before+256<<10 {
		t.Errorf("heap grew by %d B", after-before)
	}
	if s := n.Stats(); s.MRs != 0 || s.QPs != 0 {
		t.Errorf("live objects after churn: %+v", s)
	}
	cq.Close()
	if err := pd.Close(); err != nil {
		t.Errorf("PD close after churn: %v", err)
	}
}

// TestDeadPeerRetryExceeded: requests to a node that has gone fail with
// RETRY_EXC_ERR within the retry timeout, over both wires: within 1 s of
// the process running (time it did not run at all is not counted: at nice
// 19 beside busy loops the 200 ms timeout took 1.1-1.3 s of wall time).
func TestDeadPeerRetryExceeded(t *testing.T) {
	for name, mk := range pairs(t) {
		t.Run(name, func(t *testing.T) {
			a, b := mk(t)
			x, y := connectPair(t, a, b, 4096)
			b.Close()
			cpu := newOffCPU(t)
			start := time.Now()
			wr := verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 8)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}
			if _, err := x.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			wc := waitWC(t, x.cq)
			if !errors.Is(wc.Err(), verbs.RetryExcErr) {
				t.Fatalf("got %+v, want RETRY_EXC_ERR", wc)
			}
			if run, wall := cpu.running(start, time.Now()); run > time.Second {
				t.Errorf("took %v with the process running (%v wall); retry timeout is 200ms", run, wall)
			}
		})
	}
}

// TestBlackHolePeer: a peer whose TCP link is up but that never answers
// (a hung process) fails requests in flight with RETRY_EXC_ERR.
func TestBlackHolePeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			go func() { // accept the hello, answer it, then swallow everything
				buf := make([]byte, 4096)
				io.ReadFull(c, buf[:4+64+2]) // the hello, up to its version
				ack := make([]byte, 4+64+2)
				binary.BigEndian.PutUint32(ack, 64+2)
				ack[4] = 4                 // hello-ack, syndrome 0: accepted
				copy(ack[68:], buf[68:70]) // the dialer's protocol version
				c.Write(ack)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	a, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	x := newSide(t, a, 4096)
	if err := verbs.Connect(x.qp, verbs.Endpoint{Addr: ln.Addr().String(), QPN: 99}, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	wr := verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, 8)}, RemoteAddr: 4096, RKey: 1}
	start := time.Now()
	x.qp.PostSend([]verbs.SendWR{wr})
	wc := waitWC(t, x.cq)
	if !errors.Is(wc.Err(), verbs.RetryExcErr) || time.Since(start) > 2*time.Second {
		t.Fatalf("got %+v after %v, want RETRY_EXC_ERR within the timeout", wc, time.Since(start))
	}
}

// TestDuplicateNameFails: a second node given a name already on the fabric
// is refused with ErrAddrInUse (and ErrInvalid), and the fabric stays
// usable: the first node keeps working and nodes come and go as before.
func TestDuplicateNameFails(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fab := soft.NewFabric()
		first, err := fab.NewNode(soft.Config{Name: "twin"})
		if err != nil {
			t.Error(err)
			return
		}
		defer first.Close()
		dup, err := fab.NewNode(soft.Config{Name: "twin"})
		if err == nil {
			dup.Close()
			t.Error("second node named twin: no error")
		}
		if !errors.Is(err, soft.ErrAddrInUse) || !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("second node named twin: %v, want ErrAddrInUse wrapping ErrInvalid", err)
		}
		if !first.Port().Active {
			t.Error("the first node was closed by the refused second one")
		}
		if devs, _ := (&soft.Provider{Fabric: fab}).Devices(); len(devs) != 1 || devs[0] != first.Addr() {
			t.Errorf("fabric lists %v, want only %s", devs, first.Addr())
		}
		other, err := fab.NewNode(soft.Config{Name: "other"})
		if err != nil {
			t.Errorf("new node after the refusal: %v", err)
			return
		}
		if err := other.Close(); err != nil {
			t.Errorf("close after the refusal: %v", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("NewNode or Close on the fabric hung after a duplicate name")
	}
}

// TestCloseReleasesEverything: a node's Close destroys every object made
// from it (QPs, AHs, SRQs, MRs, CQs, PDs), unpins the registered memory,
// wakes a CQ waiter with ErrClosed, and leaves later Closes of the objects
// reporting ErrClosed.
func TestCloseReleasesEverything(t *testing.T) {
	fab := soft.NewFabric()
	n, err := fab.NewNode(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	peer, err := fab.NewNode(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	blk, err := offheap.Alloc(1 << 16)
	must(err)
	defer blk.Close()
	pd, err := n.AllocPD()
	must(err)
	cq, err := n.CreateCQ(64)
	must(err)
	mr, err := pd.RegMR(blk.Bytes(), verbs.AccessAll)
	must(err)
	srq, err := pd.CreateSRQ(verbs.SRQInit{MaxWR: 8, MaxSGE: 1})
	must(err)
	ah, err := pd.CreateAH(verbs.AHAttr{Dest: verbs.Endpoint{Addr: peer.Addr()}})
	must(err)
	rc, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, SRQ: srq})
	must(err)
	dci, err := pd.CreateQP(verbs.QPInit{Type: verbs.DCI, SendCQ: cq, RecvCQ: cq})
	must(err)
	must(verbs.Ready(dci, verbs.Path{}))
	_, err = srq.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{verbs.SGEOf(mr, 0, 64)}}})
	must(err)
	if s := n.Stats(); s.PDs != 1 || s.CQs != 1 || s.MRs != 1 || s.QPs != 2 || s.SRQs != 1 {
		t.Fatalf("before Close: %+v", s)
	}
	if err := blk.Close(); !errors.Is(err, offheap.ErrPinned) {
		t.Fatalf("freeing registered memory: %v, want ErrPinned", err)
	}

	waited := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		waited <- cq.Wait(ctx)
	}()
	must(n.Close())
	if err := <-waited; !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("CQ waiter woken by Close with %v, want ErrClosed", err)
	}
	if s := n.Stats(); s != (soft.Stats{}) {
		t.Errorf("after Close the node still holds %+v", s)
	}
	if err := blk.Close(); err != nil {
		t.Errorf("memory still pinned after the node closed: %v", err)
	}
	for name, c := range map[string]io.Closer{"RC QP": rc, "DCI": dci, "AH": ah, "SRQ": srq, "MR": mr, "CQ": cq, "PD": pd} {
		if err := c.Close(); !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("%s closed after its node: %v, want ErrClosed", name, err)
		}
	}
	if _, err := n.AllocPD(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("AllocPD on a closed node: %v, want ErrClosed", err)
	}
}
