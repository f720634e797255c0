package lite

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/provider/soft"
)

// TestPoppingRecvChurn: servers whose Recvs keep ending by their short
// deadlines, so that the role to pop the port is taken, left and taken
// back all the time, lose no call: every call of two callers is answered
// with its request. Then Close of the service while its Recvs wait and a
// call is under way, and of the Node twice, end every Recv with
// krcore.ErrClosed and the call with an error, none hanging.
func TestPoppingRecvChurn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Requests get 10 s (the cluster's default is 1 s): under -race at a
	// load of 20 a starved responder may take longer, which this test is
	// not about.
	r := newRPCRigOn(ctx, t, cluster.Config{Nodes: 2, Soft: soft.Config{RetryTimeout: 10 * time.Second}})
	const servers, callers, calls = 3, 2, 400
	srvErr := make(chan error, servers)
	for i := range servers {
		go func() {
			for {
				rctx, rcancel := context.WithTimeout(ctx, time.Duration(i+1)*time.Millisecond)
				c, err := r.svc.Recv(rctx)
				rcancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
					continue
				case err != nil:
					srvErr <- err
					return
				}
				if err := r.svc.Reply(ctx, c, c.Req); err != nil && !errors.Is(err, krcore.ErrClosed) {
					srvErr <- fmt.Errorf("reply: %w", err)
					return
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var resp [16]byte
			for k := range calls {
				req := fmt.Sprintf("c%d-%d", i, k)
				n, err := r.caller.Call(ctx, 2, 1, []byte(req), resp[:])
				if err != nil || string(resp[:n]) != req {
					t.Errorf("call %s: %q, %v", req, resp[:n], err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	callDone := make(chan error, 1)
	go func() {
		var resp [16]byte
		for {
			if _, err := r.caller.Call(ctx, 2, 1, []byte("late"), resp[:]); err != nil {
				callDone <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond) // calls and Recvs under way: Close meets them wherever they are
	if err := r.svc.Close(); err != nil {
		t.Fatalf("Service.Close: %v", err)
	}
	for range servers {
		select {
		case err := <-srvErr:
			if !errors.Is(err, krcore.ErrClosed) {
				t.Errorf("a server's Recv after Close: %v, want ErrClosed", err)
			}
		case <-ctx.Done():
			t.Fatal("Close did not end the servers' Recvs")
		}
	}
	select {
	case err := <-callDone:
		if ctx.Err() != nil {
			t.Fatalf("a call to a closed service ended only with its context: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("a call to a closed service did not end")
	}
	if _, err := r.svc.Recv(ctx); !errors.Is(err, krcore.ErrClosed) {
		t.Fatalf("Recv after Close: %v, want ErrClosed", err)
	}

	// A Recv waiting (popping, or not) on another service as the Node
	// closes, twice.
	svc2, err := r.callee.RegisterRPC(2)
	if err != nil {
		t.Fatal(err)
	}
	recv2 := make(chan error, 1)
	go func() { _, err := svc2.Recv(ctx); recv2 <- err }()
	time.Sleep(10 * time.Millisecond)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		r.callee.Close()
		r.callee.Close()
	}()
	select {
	case err := <-recv2:
		if !errors.Is(err, krcore.ErrClosed) {
			t.Fatalf("Recv as its Node closed: %v, want ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("Node.Close did not end a waiting Recv")
	}
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Node.Close twice did not return")
	}
}
