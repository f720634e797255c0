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

// TestDialTCP: dialTCP connects to literal addresses itself and to names
// through net.Dialer, and fails as net.Dial does.
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

// TestDialTCPPending: a connect the kernel has not finished (the
// listener's accept queue is full, so its SYN is dropped) ends at the
// context's deadline, and completes once the listener makes room.
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
	// A connect under way (its SYN dropped), then room in the queue
	// (every connection made is in it, none accepted: these accepts never
	// wait): the SYN sent again is answered and awaitConnect returns.
	var finished []int // connected after all (a dial above was slow): in the queue too
	defer func() {
		for _, f := range finished {
			syscall.Close(f)
		}
	}()
	var cfd int
	for {
		if len(finished) > 8 {
			t.Fatal("every connect finished: the accept queue never filled")
		}
		if cfd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Connect(cfd, sa); err != syscall.EINPROGRESS {
			syscall.Close(cfd)
			t.Fatalf("connect: %v, want EINPROGRESS", err)
		}
		done, err := connectDone(cfd)
		if err != nil {
			syscall.Close(cfd)
			t.Fatal(err)
		}
		if !done {
			break
		}
		finished = append(finished, cfd)
	}
	f := os.NewFile(uintptr(cfd), "")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range len(conns) + len(finished) {
		nfd, _, err := syscall.Accept(fd)
		if err != nil {
			t.Fatal(err)
		}
		syscall.Close(nfd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := awaitConnect(ctx, nc.(*net.TCPConn)); err != nil {
		t.Fatalf("a connect that waited for room: %v", err)
	}
}
