package smc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/krcore/krcore/smc/internal/smcopt"
)

// TestRDMAUnprivileged: in the kernel wire mode, a process that cannot
// load the SMC option's BPF program (EPERM, as without CAP_BPF) tries it
// once, and its Listen and Dial run plain TCP with the reason and the
// error on every connection, net.Conn exactly (nettest). The device is
// not needed: the option is loaded before anything touches it.
func TestRDMAUnprivileged(t *testing.T) {
	var loads atomic.Int32
	defer func(f func(string) (*smcopt.Announcer, error)) { openAnnouncer = f }(openAnnouncer)
	openAnnouncer = func(string) (*smcopt.Announcer, error) {
		loads.Add(1)
		return nil, fmt.Errorf("bpf(BPF_PROG_LOAD): %w", syscall.EPERM)
	}
	opts := &Options{RDMA: &RDMA{}}
	ln, err := Listen("tcp", "127.0.0.1:0", opts)
	if err != nil {
		t.Fatalf("Listen without the privileges: %v, want a TCP listener", err)
	}
	defer ln.Close()
	tcpMode := func(what string, c net.Conn) {
		if m := ModeOf(c); m.SMC || m.Reason != ReasonNoRuntime || !errors.Is(m.Err, syscall.EPERM) {
			t.Errorf("%s: mode %v, want TCP, %v, with the EPERM", what, m, ReasonNoRuntime)
		}
	}
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		acc := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			acc <- c
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c1, err = DialContext(ctx, "tcp", ln.Addr().String(), opts); err != nil {
			return nil, nil, nil, err
		}
		c2 = <-acc
		tcpMode("dialled", c1)
		tcpMode("accepted", c2)
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
	if k := loads.Load(); k != 1 {
		t.Errorf("the BPF program was loaded %d times, want once", k)
	}
}
