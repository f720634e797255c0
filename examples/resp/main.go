// Command resp is a small Redis-protocol (RESP) server written on an smc
// listener: the proof of package smc with a real client, redis-benchmark.
// Its Go RESP clients run over SMC; redis-benchmark and redis-cli, which
// know nothing of SMC, run over TCP on the same port (smc's fallback).
//
//	go run ./examples/resp [-listen 127.0.0.1:6380] [-socket PATH | -plain]
//
// With -socket it attaches to krcored and opens an smc.Node there, so SMC
// clients (smc.Dial with a Node) get RDMA; without it, or when the daemon
// cannot be reached, it serves TCP alone (every proposal declined as
// "no krcore runtime") and says so. -plain serves on net.Listen instead of
// smc.Listen, the baseline for what the smc listener costs a TCP client.
// It speaks enough of RESP for
// redis-benchmark's ping, set, get, incr, lpush, rpush, lpop, rpop and
// mset tests and redis-cli: PING, ECHO, SET, MSET, GET, INCR, DEL, LPUSH,
// RPUSH, LPOP, RPOP, LLEN, CONFIG (an empty answer), QUIT, as arrays of
// bulk strings or inline. krctl smc lists its connections.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/smc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "resp:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "resp:", err)
		os.Exit(1)
	}
}

// errUsage marks a bad command line (exit status 2, as flag's own).
var errUsage = errors.New("usage")

// run serves until ctx ends; it prints the address it listens on first.
func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("resp", flag.ContinueOnError)
	addr := fs.String("listen", "127.0.0.1:6380", "TCP address to serve")
	sock := fs.String("socket", "", "krcored's socket: serve SMC clients over krcore (empty: TCP only)")
	plain := fs.Bool("plain", false, "serve on net.Listen, not an smc listener (a baseline)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *plain && *sock != "" {
		return fmt.Errorf("%w: -plain and -socket: choose one", errUsage)
	}
	opts := &smc.Options{}
	if *sock != "" {
		node, closeNode, err := openNode(ctx, *sock)
		if err != nil {
			fmt.Fprintf(out, "no krcore runtime (%v): serving TCP only\n", err)
		} else {
			defer closeNode()
			opts.Node = node
		}
	}
	var ln net.Listener
	var err error
	if *plain {
		ln, err = net.Listen("tcp", *addr)
	} else {
		ln, err = smc.Listen("tcp", *addr, opts)
	}
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintf(out, "listening %s smc=%v\n", ln.Addr(), opts.Node != nil)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	err = newStore().serve(ln)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// openNode attaches to krcored at sock and opens an SMC Node there;
// closeNode closes both.
func openNode(ctx context.Context, sock string) (*smc.Node, func(), error) {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cl, err := client.Attach(actx, client.Options{Socket: sock})
	if err != nil {
		return nil, nil, err
	}
	n, err := smc.Open(cl, smc.NodeOptions{})
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	return n, func() { n.Close(); cl.Close() }, nil
}
