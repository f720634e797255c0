package control

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// pair is the two ends of a control connection over loopback TCP.
func pair(t *testing.T) (client, server *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	client, server = NewConn(context.Background(), c), NewConn(context.Background(), s)
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestCallAndReply: a request reaches the server whole, its reply comes
// back to Call, and a reply carrying Err is a *RemoteError naming the
// request.
func TestCallAndReply(t *testing.T) {
	client, server := pair(t)
	go func() {
		m, err := server.Recv(time.Second)
		if err != nil {
			return
		}
		server.Send(&Msg{Op: m.Op, MR: &MR{Addr: m.MR.Addr + 1, RKey: 7, Len: m.MR.Len}}, time.Second)
		m, err = server.Recv(time.Second)
		if err == nil {
			server.Send(&Msg{Op: m.Op, Err: "no such test"}, time.Second)
		}
	}()
	r, err := client.Call(&Msg{Op: OpSetup, Version: Version, MR: &MR{Addr: 41, Len: 8}}, time.Second)
	if err != nil || r.MR == nil || r.MR.Addr != 42 || r.MR.RKey != 7 || r.MR.Len != 8 {
		t.Fatalf("setup reply %+v, %v", r, err)
	}
	_, err = client.Call(&Msg{Op: OpRun, Test: "nope"}, time.Second)
	var re *RemoteError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "run") || !strings.Contains(err.Error(), "no such test") {
		t.Errorf("failed run: %v, want a RemoteError naming run and the reason", err)
	}
}

// TestRecvBounds: a peer that hangs up is ErrPeerClosed, a silent one
// ends the read at its timeout, and a line longer than the largest frame
// is refused rather than buffered.
func TestRecvBounds(t *testing.T) {
	client, server := pair(t)
	t0 := time.Now()
	if _, err := server.Recv(50 * time.Millisecond); err == nil || time.Since(t0) > 5*time.Second {
		t.Errorf("silent peer: %v after %v", err, time.Since(t0))
	}
	go client.conn.Write([]byte(strings.Repeat("x", maxFrameBytes+4096)))
	if _, err := server.Recv(5 * time.Second); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("oversized line: %v", err)
	}
	client2, server2 := pair(t)
	client2.Close()
	if _, err := server2.Recv(5 * time.Second); !errors.Is(err, ErrPeerClosed) {
		t.Errorf("hung-up peer: %v, want ErrPeerClosed", err)
	}
}

// TestWatch: the watch's context ends when the peer hangs up; stop ends
// a watch whose peer stayed, leaving the connection usable.
func TestWatch(t *testing.T) {
	client, server := pair(t)
	ctx, stop := server.Watch(context.Background())
	stop()
	if ctx.Err() == nil {
		t.Error("context not done after stop")
	}
	go client.Send(&Msg{Op: OpBye}, time.Second)
	if m, err := server.Recv(5 * time.Second); err != nil || m.Op != OpBye {
		t.Fatalf("after a stopped watch: %+v, %v", m, err)
	}
	ctx, stop = server.Watch(context.Background())
	defer stop()
	client.Close()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Error("watch did not see the peer hang up")
	}
}
