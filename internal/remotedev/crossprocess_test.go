package remotedev_test

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/remotedev"
	"github.com/krcore/krcore/verbs"
)

// side is one end of an RC connection, with a registered buffer.
type side struct {
	rig
	mr verbs.MR
}

// rcPair connects an RC QP on a local soft node to one on a soft node in a
// child process. The child's requests wait the default retry budget: 200
// ms (the local node's, which link-death tests count on) is less than a
// process may go unscheduled on a loaded 2-core machine, and a live but
// starved peer would then fail them with RETRY_EXC_ERR.
func rcPair(t *testing.T, size int) (local, proxied *side, ch *remotedev.Child) {
	t.Helper()
	ch = startChild(t, "soft-default", remotedev.Options{})
	local, proxied = newSide(t, localNode(t), size), newSide(t, ch.Client, size)
	if err := verbs.Connect(local.qp, proxied.qp.Endpoint(), verbs.Path{}); err != nil {
		t.Fatalf("connect local: %v", err)
	}
	if err := verbs.Connect(proxied.qp, local.qp.Endpoint(), verbs.Path{}); err != nil {
		t.Fatalf("connect proxied: %v", err)
	}
	return local, proxied, ch
}

func newSide(t *testing.T, dev verbs.Device, size int) *side {
	t.Helper()
	s := &side{}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	if s.cq, err = dev.CreateCQ(1024); err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	s.qp, err = s.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatalf("CreateQP: %v", err)
	}
	if s.mr, err = s.pd.RegMR(sharedBlock(t, size).Bytes(), verbs.AccessAll); err != nil {
		t.Fatalf("RegMR: %v", err)
	}
	t.Cleanup(func() {
		// Release in verbs order so the block's pin is gone before the
		// block is freed; errors are fine (the peer may be dead).
		s.qp.Close()
		s.mr.Close()
		s.cq.Close()
		s.pd.Close()
	})
	return s
}

// TestConcurrentWritesFromProxiedQP has many goroutines post WRITEs on one
// proxied QP into the local node's memory, over the soft RNIC's TCP link.
func TestConcurrentWritesFromProxiedQP(t *testing.T) {
	const workers, each = 4, 32
	local, proxied, _ := rcPair(t, workers*each*8)
	for i := range workers * each {
		binary.NativeEndian.PutUint64(proxied.mr.Bytes()[i*8:], uint64(i)+1)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w * each; i < (w+1)*each; i++ {
				wr := verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.Signaled,
					SGL:        []verbs.SGE{verbs.SGEOf(proxied.mr, i*8, 8)},
					RemoteAddr: local.mr.Addr() + uint64(i*8), RKey: local.mr.RKey()}
				if _, err := postRetry(proxied.qp, wr); err != nil {
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
		wc := pollOne(t, proxied.cq)
		if wc.Status != verbs.Success || seen[wc.ID] {
			t.Fatalf("completion %+v (seen before: %v)", wc, seen[wc.ID])
		}
		seen[wc.ID] = true
	}
	for i := range workers * each {
		if got := binary.NativeEndian.Uint64(local.mr.Bytes()[i*8:]); got != uint64(i)+1 {
			t.Fatalf("local word %d = %d, want %d", i, got, i+1)
		}
	}
}

// postRetry posts one WR, waiting out a full send queue: the QP has fewer
// slots than the test has WRs in flight.
func postRetry(qp verbs.QP, wr verbs.SendWR) (int, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := qp.PostSend([]verbs.SendWR{wr})
		if !errors.Is(err, verbs.ErrQueueFull) || time.Now().After(deadline) {
			return n, err
		}
		time.Sleep(time.Millisecond)
	}
}

// TestChildCrash kills the process holding one end of an RC connection:
// the surviving end's work fails with RETRY_EXC_ERR within a bounded time,
// and the proxy's calls fail with ErrClosed.
func TestChildCrash(t *testing.T) {
	local, proxied, ch := rcPair(t, 64)
	read := func(id uint64) verbs.SendWR {
		return verbs.SendWR{ID: id, Op: verbs.OpRead, Flags: verbs.Signaled,
			SGL:        []verbs.SGE{verbs.SGEOf(local.mr, 0, 8)},
			RemoteAddr: proxied.mr.Addr(), RKey: proxied.mr.RKey()}
	}
	binary.NativeEndian.PutUint64(proxied.mr.Bytes(), 0xfeed)
	if _, err := local.qp.PostSend([]verbs.SendWR{read(1)}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, local.cq); wc.Status != verbs.Success || binary.NativeEndian.Uint64(local.mr.Bytes()) != 0xfeed {
		t.Fatalf("READ before the crash: %+v, read %#x", wc, binary.NativeEndian.Uint64(local.mr.Bytes()))
	}
	if err := ch.Kill(); err != nil {
		t.Fatalf("kill child: %v", err)
	}
	start := time.Now()
	if _, err := local.qp.PostSend([]verbs.SendWR{read(2)}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, local.cq); !errors.Is(wc.Err(), verbs.RetryExcErr) {
		t.Errorf("READ to a dead process: %+v, want RETRY_EXC_ERR", wc)
	}
	t.Logf("peer death reported after %v", time.Since(start))
	if _, err := proxied.qp.PostSend([]verbs.SendWR{read(3)}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("post on the dead process's QP: err = %v, want ErrClosed", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := proxied.cq.Wait(ctx); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("wait on the dead process's CQ: err = %v, want ErrClosed", err)
	}
}
