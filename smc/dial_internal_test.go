package smc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestDialTCP: dialTCP connects to literal addresses and to names, and
// fails as net.Dial does.
func TestDialTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, addr := range []string{ln.Addr().String(), fmt.Sprintf("localhost:%d", port), fmt.Sprintf("[::ffff:127.0.0.1]:%d", port)} {
		tc, err := dialTCP(ctx, "tcp", addr)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if s.RemoteAddr().String() != tc.LocalAddr().String() || tc.RemoteAddr().String() != ln.Addr().String() {
			t.Fatalf("dial %s: local %v remote %v; the server sees %v", addr, tc.LocalAddr(), tc.RemoteAddr(), s.RemoteAddr())
		}
		if _, err := tc.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		s.Close()
		tc.Close()
	}
	if _, err := dialTCP(ctx, "tcp6", ln.Addr().String()); err == nil {
		t.Fatal("an IPv4 address dialled as tcp6")
	}
	ln.Close()
	_, err = dialTCP(ctx, "tcp", ln.Addr().String())
	var oe *net.OpError
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &oe) || oe.Op != "dial" {
		t.Fatalf("dial a closed port: %v, want a dial OpError with ECONNREFUSED", err)
	}
}

// TestDialTCPPending: a connect the kernel has not finished inside
// connectEarly's connect (the listener's accept queue is full, so its SYN
// is dropped) ends at the context's deadline, and completes once the
// listener makes room.
func TestDialTCPPending(t *testing.T) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	var conns []*net.TCPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// Fill the accept queue until a dial waits past its deadline.
	for {
		if len(conns) > 8 {
			t.Fatal("no connect waited: the accept queue never filled")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		tc, err := dialTCP(ctx, "tcp", addr)
		cancel()
		if err == nil {
			conns = append(conns, tc)
			continue
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a dial past its deadline: %v, want context.DeadlineExceeded", err)
		}
		break
	}
	// A connect under way (its SYN dropped: the queue is full, as the
	// dial above found), then room in the queue (every connection made is
	// in it, none accepted: these accepts never wait): the SYN sent again
	// is answered and the dial returns.
	type result struct {
		tc  *net.TCPConn
		err error
	}
	res := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		tc, err := dialTCP(ctx, "tcp", addr)
		res <- result{tc, err}
	}()
	select {
	case r := <-res:
		t.Fatalf("a dial into a full accept queue returned (%v) before room was made", r.err)
	case <-time.After(100 * time.Millisecond):
	}
	for range conns {
		nfd, _, err := syscall.Accept(fd)
		if err != nil {
			t.Fatal(err)
		}
		syscall.Close(nfd)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("a connect that waited for room: %v", r.err)
	}
	r.tc.Close()
}

// TestSockaddr: connectEarly's socket address fits the socket's family,
// and an address it cannot name (a zone, a name) is left to net.Dialer.
func TestSockaddr(t *testing.T) {
	for _, tc := range []struct {
		network, address string
		want             syscall.Sockaddr
	}{
		{"tcp4", "127.0.0.1:80", &syscall.SockaddrInet4{Port: 80, Addr: [4]byte{127, 0, 0, 1}}},
		{"tcp4", "[::ffff:127.0.0.1]:80", &syscall.SockaddrInet4{Port: 80, Addr: [4]byte{127, 0, 0, 1}}},
		{"tcp6", "[::1]:443", &syscall.SockaddrInet6{Port: 443, Addr: [16]byte{15: 1}}},
		{"tcp6", "127.0.0.1:80", &syscall.SockaddrInet6{Port: 80, Addr: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}}},
		{"tcp4", "[::1]:80", nil},
		{"tcp6", "[fe80::1%lo]:80", nil},
		{"tcp4", "localhost:80", nil},
	} {
		got := sockaddr(tc.network, tc.address)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("sockaddr(%q, %q) = %v, want %v", tc.network, tc.address, got, tc.want)
		}
	}
}

// TestCtxTimeout: a dial that failed on the socket's deadline (ctx's,
// before ctx's own timer fired) says ctx's deadline; other failures, and
// the same before the deadline, are left as they are.
func TestCtxTimeout(t *testing.T) {
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	future, cancel2 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel2()
	timeout := func() error { return &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded} }
	if err := ctxTimeout(past, timeout()); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("past the deadline: %v, want context.DeadlineExceeded", err)
	}
	if err := ctxTimeout(future, timeout()); errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("before the deadline: %v, want the i/o timeout", err)
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	if err := ctxTimeout(past, refused); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("refused: %v", err)
	}
}
