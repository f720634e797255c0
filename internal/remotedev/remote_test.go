package remotedev_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/errid"
	"github.com/krcore/krcore/internal/remotedev"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// served is a fake device served in-process over a pipe.
type served struct {
	dev    *fakeDev
	client *remotedev.Client
	cancel context.CancelFunc // stops the server
	done   chan struct{}      // closed when Serve has returned
	err    error              // Serve's result, set before done closes
}

func serveFake(t *testing.T, opt remotedev.Options) *served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sc, cc := net.Pipe()
	s := &served{dev: newFakeDev(), cancel: cancel, done: make(chan struct{})}
	go func() {
		s.err = remotedev.Serve(ctx, sc, s.dev)
		close(s.done)
	}()
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	c, err := remotedev.NewClient(hctx, cc, opt)
	if err != nil {
		cancel()
		t.Fatalf("NewClient: %v", err)
	}
	s.client = c
	t.Cleanup(func() {
		c.Close()
		cancel()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after its context ended")
		}
	})
	return s
}

// rig is a PD, a CQ and an RC QP in RTS on a device.
type rig struct {
	pd verbs.PD
	cq verbs.CQ
	qp verbs.QP
}

func newRig(t *testing.T, dev verbs.Device) *rig {
	t.Helper()
	r := &rig{}
	var err error
	if r.pd, err = dev.AllocPD(); err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	if r.cq, err = dev.CreateCQ(1 << 14); err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	if r.qp, err = r.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: r.cq, RecvCQ: r.cq, Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64}}); err != nil {
		t.Fatalf("CreateQP: %v", err)
	}
	for _, s := range []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS} {
		if err := r.qp.Modify(verbs.QPAttr{State: s, Dest: r.qp.Endpoint()}); err != nil { // connected to itself
			t.Fatalf("Modify %s: %v", s, err)
		}
	}
	return r
}

func sharedBlock(t *testing.T, size int) *offheap.Block {
	t.Helper()
	b, err := offheap.AllocShared(t.Name(), size)
	if err != nil {
		t.Fatalf("AllocShared: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestHelloCachesDevice(t *testing.T) {
	s := serveFake(t, remotedev.Options{})
	if got := s.client.Name(); got != "fake" {
		t.Errorf("Name = %q, want fake", got)
	}
	if got := s.client.Attr().MaxQP; got != 64 {
		t.Errorf("Attr().MaxQP = %d, want 64", got)
	}
	if p := s.client.Port(); !p.Active || p.Addr != "fake:1" {
		t.Errorf("Port = %+v, want active fake:1", p)
	}
}

func TestErrorsKeepTheirIdentity(t *testing.T) {
	s := serveFake(t, remotedev.Options{})
	pd, err := s.client.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := s.client.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	err = qp.Modify(verbs.QPAttr{State: verbs.StateRTS})
	if !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("RESET->RTS: err = %v, want ErrQPState", err)
	}
	var rerr *errid.Error
	if !errors.As(err, &rerr) {
		t.Errorf("RESET->RTS: err %T is not a *errid.Error", err)
	}
	if n, err := qp.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpSend}}); n != 0 || !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("post in RESET = %d, %v; want 0, ErrQPState", n, err)
	}
	if err := pd.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("close PD with a QP: err = %v, want ErrBusy", err)
	}
	if _, err := s.client.CreateCQ(0); !errors.Is(err, verbs.ErrInvalid) || errors.Is(err, verbs.ErrBusy) {
		t.Errorf("CreateCQ(0): err = %v, want ErrInvalid only", err)
	}
	if err := qp.Close(); err != nil {
		t.Fatalf("close QP: %v", err)
	}
	if err := qp.Close(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("second close QP: err = %v, want ErrClosed", err)
	}
	if err := pd.Close(); err != nil {
		t.Errorf("close PD: %v", err)
	}
}

func TestCompletionStatusSurvives(t *testing.T) {
	s := serveFake(t, remotedev.Options{})
	r := newRig(t, s.client)
	blk := sharedBlock(t, 4096)
	mr, err := r.pd.RegMR(blk.Bytes(), verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	wr := verbs.SendWR{ID: 7, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(mr, 0, 8)},
		RemoteAddr: mr.Addr(), RKey: mr.RKey() + 1}
	if _, err := r.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	wc := pollOne(t, r.cq)
	var ce *verbs.CompletionError
	if err := wc.Err(); !errors.Is(err, verbs.RemAccessErr) || !errors.As(err, &ce) || ce.ID != 7 {
		t.Errorf("completion = %+v (err %v), want REM_ACCESS_ERR for WR 7", wc, err)
	}
	if st := r.qp.State(); st != verbs.StateErr {
		t.Errorf("QP state after access error = %s, want ERR", st)
	}
}

func pollOne(t *testing.T, cq verbs.CQ) verbs.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		wc := make([]verbs.WC, 1)
		n, err := cq.Poll(wc)
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if n == 1 {
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("Wait: %v", err)
		}
	}
}

func TestRegMRNeedsSharedMemory(t *testing.T) {
	s := serveFake(t, remotedev.Options{})
	pd, err := s.client.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	priv, err := offheap.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer priv.Close()
	for name, buf := range map[string][]byte{"private": priv.Bytes(), "heap": make([]byte, 64)} {
		_, err := pd.RegMR(buf, verbs.AccessLocalWrite)
		if !errors.Is(err, offheap.ErrNotOffHeap) || !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("RegMR(%s) err = %v, want ErrNotOffHeap and ErrInvalid", name, err)
		}
	}
	if n := s.dev.live.Load(); n != 1 {
		t.Errorf("server has %d live objects after refused registrations, want 1 (the PD)", n)
	}
}

// TestRegMRSharesPages registers two ranges of one shared block: the server
// registers its own mapping (other addresses), and a WRITE done by the
// server's device shows in the client's bytes.
func TestRegMRSharesPages(t *testing.T) {
	s := serveFake(t, remotedev.Options{})
	r := newRig(t, s.client)
	blk := sharedBlock(t, 2*4096)
	src, err := r.pd.RegMR(blk.Bytes()[:4096], verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := r.pd.RegMR(blk.Bytes()[4096:], verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if dst.Addr() == offheap.Addr(dst.Bytes()) {
		t.Errorf("MR Addr %#x is the client's address; want the server's mapping", dst.Addr())
	}
	if &dst.Bytes()[0] != &blk.Bytes()[4096] || dst.Len() != 4096 {
		t.Errorf("MR Bytes is not the client's slice")
	}
	copy(src.Bytes(), "hello, other process")
	wr := verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 20)},
		RemoteAddr: dst.Addr() + 100, RKey: dst.RKey()}
	if _, err := r.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, r.cq); wc.Status != verbs.Success {
		t.Fatalf("WRITE completed with %s", wc.Status)
	}
	if got := string(dst.Bytes()[100:120]); got != "hello, other process" {
		t.Errorf("client sees %q after the server's WRITE", got)
	}
	if err := blk.Close(); !errors.Is(err, offheap.ErrPinned) {
		t.Errorf("closing a registered block: err = %v, want ErrPinned", err)
	}
	for _, m := range []verbs.MR{src, dst} {
		if err := m.Close(); err != nil {
			t.Fatalf("close MR: %v", err)
		}
	}
	if err := blk.Close(); err != nil {
		t.Errorf("closing the block after deregistration: %v", err)
	}
}

// TestConcurrentPosts posts from many goroutines on one proxied QP and
// checks every completion arrives exactly once.
func TestConcurrentPosts(t *testing.T) {
	s := serveFake(t, remotedev.Options{})
	r := newRig(t, s.client)
	const workers, each = 8, 100
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := uint64(w*each + i)
				if _, err := r.qp.PostSend([]verbs.SendWR{{ID: id, Op: verbs.OpSend, Flags: verbs.Signaled}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("PostSend: %v", err)
	}
	seen := make(map[uint64]bool)
	for len(seen) < workers*each {
		wc := pollOne(t, r.cq)
		if seen[wc.ID] {
			t.Fatalf("completion %d twice", wc.ID)
		}
		seen[wc.ID] = true
	}
}

func TestWaitHonoursContext(t *testing.T) {
	s := serveFake(t, remotedev.Options{WaitSlice: 20 * time.Millisecond})
	r := newRig(t, s.client)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := r.cq.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait on an empty CQ: err = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Wait returned %v after its 100ms deadline", d)
	}

	ctx, cancel = context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	if err := r.cq.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait cancelled: err = %v, want Canceled", err)
	}

	go func() {
		time.Sleep(100 * time.Millisecond) // several wait slices
		r.qp.PostSend([]verbs.SendWR{{ID: 9, Op: verbs.OpSend, Flags: verbs.Signaled}})
	}()
	if wc := pollOne(t, r.cq); wc.ID != 9 {
		t.Errorf("woke with completion %d, want 9", wc.ID)
	}
}

func TestForeignObjectsRefused(t *testing.T) {
	s1 := serveFake(t, remotedev.Options{})
	s2 := serveFake(t, remotedev.Options{})
	pd, err := s1.client.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := s2.client.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("QP with another device's CQ: err = %v, want ErrInvalid", err)
	}
	if _, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("QP without CQs: err = %v, want ErrInvalid (from the server's device)", err)
	}
}

// TestAHTravelsAsHandle checks an AH named in a SendWR reaches the server's
// device as the server's own AH.
func TestAHTravelsAsHandle(t *testing.T) {
	s := serveFake(t, remotedev.Options{})
	r := newRig(t, s.client)
	dest := verbs.Endpoint{Addr: "peer:9", QPN: 5}
	ah, err := r.pd.CreateAH(verbs.AHAttr{Dest: dest})
	if err != nil {
		t.Fatal(err)
	}
	if ah.Dest() != dest {
		t.Errorf("AH Dest = %v, want %v", ah.Dest(), dest)
	}
	other := serveFake(t, remotedev.Options{})
	opd, err := other.client.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	oah, err := opd.CreateAH(verbs.AHAttr{Dest: dest})
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.qp.PostSend([]verbs.SendWR{
		{ID: 1, Op: verbs.OpSend, AH: ah, RemoteQPN: 5},
		{ID: 2, Op: verbs.OpSend, AH: oah, RemoteQPN: 5},
	})
	if n != 1 || !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("post with a foreign AH second = %d, %v; want 1, ErrInvalid", n, err)
	}
}

func TestServerGoneFailsCallsWithErrClosed(t *testing.T) {
	s := serveFake(t, remotedev.Options{})
	r := newRig(t, s.client)
	blk := sharedBlock(t, 4096)
	if _, err := r.pd.RegMR(blk.Bytes(), verbs.AccessAll); err != nil {
		t.Fatal(err)
	}
	s.cancel()
	select {
	case <-s.done:
		if !errors.Is(s.err, context.Canceled) {
			t.Errorf("Serve = %v, want context.Canceled", s.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	select {
	case <-s.client.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("client did not notice the server went away")
	}
	if _, err := r.qp.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpSend}}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("post after server gone: err = %v, want ErrClosed", err)
	}
	if _, err := s.client.AllocPD(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("AllocPD after server gone: err = %v, want ErrClosed", err)
	}
	if err := r.cq.Wait(context.Background()); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Wait after server gone: err = %v, want ErrClosed", err)
	}
	if st := r.qp.State(); st != verbs.StateErr {
		t.Errorf("State after server gone = %s, want ERR", st)
	}
	if n := s.dev.live.Load(); n != 0 {
		t.Errorf("server left %d objects open", n)
	}
	if err := blk.Close(); err != nil {
		t.Errorf("client block still pinned after server gone: %v", err)
	}
}

// TestClientHangupCleansServer drops the connection without closing the
// device: the server closes what the client left and keeps the device.
func TestClientHangupCleansServer(t *testing.T) {
	dev := newFakeDev()
	sc, cc := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- remotedev.Serve(context.Background(), sc, dev) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := remotedev.NewClient(ctx, cc, remotedev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, c)
	blk := sharedBlock(t, 4096)
	if _, err := r.pd.RegMR(blk.Bytes(), verbs.AccessAll); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pd.CreateSRQ(verbs.SRQInit{MaxWR: 4}); err != nil {
		t.Fatal(err)
	}
	cc.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after hang-up = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the client hung up")
	}
	if n := dev.live.Load(); n != 0 {
		t.Errorf("server left %d objects open", n)
	}
	if err := dev.check(); err != nil {
		t.Errorf("device closed by a hang-up: %v", err)
	}
	if _, err := c.AllocPD(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("call after hang-up: err = %v, want ErrClosed", err)
	}
	<-c.Done() // the read loop failed with the stream: it is ending
	if err := blk.Close(); err != nil {
		t.Errorf("client block still pinned after hang-up: %v", err)
	}
	if err := c.Close(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Close after hang-up: err = %v, want ErrClosed", err)
	}
}

func TestClientCloseClosesDevice(t *testing.T) {
	s := serveFake(t, remotedev.Options{})
	if err := s.client.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.dev.check(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("served device after client Close: %v, want closed", err)
	}
	if _, err := s.client.CreateCQ(4); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("call after Close: err = %v, want ErrClosed", err)
	}
}

func TestControl(t *testing.T) {
	dev := newFakeDev()
	srv := &remotedev.Server{Device: dev, Control: func(_ context.Context, name string, arg []byte) ([]byte, error) {
		if name != "echo" {
			return nil, verbs.ErrUnsupported
		}
		return bytes.ToUpper(arg), nil
	}}
	sc, cc := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ctx, sc)
	}()
	defer func() { cancel(); <-served }()
	c, err := remotedev.NewClient(ctx, cc, remotedev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := c.Control(ctx, "echo", []byte("hi")); err != nil || string(got) != "HI" {
		t.Errorf("Control(echo) = %q, %v", got, err)
	}
	if _, err := c.Control(ctx, "nope", nil); !errors.Is(err, verbs.ErrUnsupported) {
		t.Errorf("Control(nope) err = %v, want ErrUnsupported", err)
	}
}

func TestCallTimeout(t *testing.T) {
	// A server that never answers: the peer end of the pipe is read and
	// discarded.
	sc, cc := net.Pipe()
	defer sc.Close()
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := sc.Read(buf); err != nil {
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := remotedev.NewClient(ctx, cc, remotedev.Options{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("NewClient to a silent server: err = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("NewClient took %v", d)
	}
}

// TestChildProcess runs the fake device in a child process: registration
// maps the parent's memfd there, and killing the child fails calls with
// ErrClosed.
func TestChildProcess(t *testing.T) {
	ch := startChild(t, "fake", remotedev.Options{})
	if ch.Client.ServerPID() == 0 || ch.Client.ServerPID() != ch.PID() {
		t.Errorf("server PID %d, child PID %d", ch.Client.ServerPID(), ch.PID())
	}
	r := newRig(t, ch.Client)
	blk := sharedBlock(t, 8192)
	src, err := r.pd.RegMR(blk.Bytes()[:4096], verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := r.pd.RegMR(blk.Bytes()[4096:], verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	const msg = "across processes"
	copy(src.Bytes(), msg)
	wr := verbs.SendWR{ID: 3, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, len(msg))},
		RemoteAddr: dst.Addr(), RKey: dst.RKey()}
	if _, err := r.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, r.cq); wc.Status != verbs.Success {
		t.Fatalf("WRITE in child completed with %s", wc.Status)
	}
	if got := string(dst.Bytes()[:len(msg)]); got != msg {
		t.Errorf("parent sees %q after the child's WRITE", got)
	}
	if err := ch.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := r.qp.PostSend([]verbs.SendWR{{ID: 4, Op: verbs.OpSend}}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("post after child killed: err = %v, want ErrClosed", err)
	}
	if err := blk.Close(); err != nil {
		t.Errorf("block still pinned after the child died: %v", err)
	}
}

// TestUnencodableCallFailsAlone: a value gob cannot carry (an endpoint
// address too long to marshal) fails its call, not the connection.
func TestUnencodableCallFailsAlone(t *testing.T) {
	s := serveFake(t, remotedev.Options{})
	r := newRig(t, s.client)
	long := verbs.Endpoint{Addr: string(make([]byte, 300))}
	if err := r.qp.Modify(verbs.QPAttr{State: verbs.StateRTR, Dest: long}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("Modify with a 300-byte address: err = %v, want ErrInvalid", err)
	}
	if st := r.qp.State(); st != verbs.StateRTS {
		t.Errorf("connection unusable after an unencodable call: state %s", st)
	}
}

// TestDialUnix serves over a Unix socket, one fresh device per connection,
// and reaches it with Dial.
func TestDialUnix(t *testing.T) {
	path := t.TempDir() + "/remote.sock"
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); ln.Close(); wg.Wait() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				remotedev.Serve(ctx, conn, newFakeDev())
			}()
		}
	}()
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	c, err := remotedev.Dial(dctx, "unix", path, remotedev.Options{})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	newRig(t, c)
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := remotedev.Dial(dctx, "unix", path+".missing", remotedev.Options{}); err == nil {
		t.Error("Dial to a missing socket succeeded")
	}
}
