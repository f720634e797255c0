package smc

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/poprole"
)

// TestBusyReaderPopsItself: a Node's echo of a ping-pong pops its own
// messages while another connection's reader waits idle on the same Node
// (for 2*FreshFor and more): the idle reader, counted as needing a popper,
// neither keeps the serving goroutine popping nor keeps the role itself,
// either of which makes every message to the echo a hand-off (a waiter
// woken by a signal). The bound is loose: a hand-off happens when the
// echo is away for LendFor (a starved process) or the idle reader took
// the free role first.
func TestBusyReaderPopsItself(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, srv, cli := twoNodes(t, ctx)
	ln, err := Listen("tcp", "127.0.0.1:0", &Options{Node: srv})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	dial := func() (server, client net.Conn) {
		t.Helper()
		acc := make(chan net.Conn, 1)
		go func() {
			s, _ := ln.Accept()
			acc <- s
		}()
		cc, err := DialContext(ctx, "tcp", ln.Addr().String(), &Options{Node: cli})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		s := <-acc
		if s == nil {
			t.Fatal("accept failed")
		}
		t.Cleanup(func() { s.Close() })
		if _, err := cc.Write([]byte{1}); err != nil { // settles both ends
			t.Fatal(err)
		}
		var b [1]byte
		if _, err := io.ReadFull(s, b[:]); err != nil {
			t.Fatal(err)
		}
		if !ModeOf(cc).SMC || !ModeOf(s).SMC {
			t.Fatalf("modes %v, %v; want SMC", ModeOf(cc), ModeOf(s))
		}
		return s, cc
	}
	echoS, echoC := dial()
	idleS, _ := dial()
	idleDone := make(chan struct{})
	go func() {
		defer close(idleDone)
		var b [1]byte
		idleS.Read(b[:]) // waits until the cleanup closes it
	}()
	t.Cleanup(func() { idleS.Close(); <-idleDone })
	go io.Copy(echoS, echoS) // ends when the cleanup closes echoS
	const rounds = 400
	echoC.SetDeadline(time.Now().Add(time.Minute))
	buf := make([]byte, 8)
	var woken uint64
	warm := time.Now()
	for i := 0; i < rounds || !warm.IsZero(); i++ {
		if !warm.IsZero() && time.Since(warm) > 2*poprole.FreshFor { // the idle reader is idle
			warm, i = time.Time{}, 0
			woken = srv.pop.woken.Load()
		}
		if _, err := echoC.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(echoC, buf); err != nil {
			t.Fatal(err)
		}
	}
	got := srv.pop.woken.Load() - woken
	t.Logf("%d of %d messages handed off", got, rounds)
	if got > rounds/2 {
		t.Fatalf("%d of %d echoed messages were handed to the echo by a signal, want at most %d", got, rounds, rounds/2)
	}
}
