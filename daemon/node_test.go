package daemon_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/verbs"
)

// TestStartNode: Start brings up krcored on a soft RNIC: a client attaches
// to the socket and READs a region its own node exports through the
// runtime; Close ends Serve, says goodbye to the client, and closes the
// runtime and the RNIC.
func TestStartNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	n, err := daemon.Start(ctx, daemon.NodeConfig{Node: 7,
		Config: daemon.Config{Socket: sock, Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.Serve(context.Background()) }()
	cl, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		n.Close()
		t.Fatal(err)
	}
	defer cl.Close()
	if cl.Node() != 7 {
		t.Errorf("client sees node %d, want 7", cl.Node())
	}
	readOwn(ctx, t, cl)

	if err := n.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve after Close: %v", err)
	}
	if _, err := cl.Queue(); !errors.Is(err, krcore.ErrDaemonGone) {
		t.Errorf("Queue after the daemon closed: %v, want ErrDaemonGone", err)
	}
	if _, err := n.Device().AllocPD(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("AllocPD on the closed node's RNIC: %v, want ErrClosed", err)
	}
	if _, err := os.Stat(sock); err == nil {
		t.Errorf("socket %s still there after Close", sock)
	}
}

// readOwn exports a region on the client's node and READs it through a VQ.
func readOwn(ctx context.Context, t *testing.T, cl *client.Client) {
	t.Helper()
	mem, err := cl.RegMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem.Bytes()[64:], "through krcored")
	if err := cl.Export("own", mem, 64, 64, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	q, err := cl.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Connect(ctx, cl.Node(), nil); err != nil {
		t.Fatal(err)
	}
	g, err := q.Region(ctx, "own")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Push(ctx, false, krcore.Request{ID: 1, Op: verbs.OpRead, Local: mem.Range(0, 15), Remote: g.At(0)}); err != nil {
		t.Fatal(err)
	}
	out := make([]krcore.Completion, 1)
	if k, err := q.PopWait(ctx, out); err != nil || k != 1 || out[0].Status != verbs.Success || string(mem.Bytes()[:15]) != "through krcored" {
		t.Fatalf("READ of the own node's region: %d %+v %v, read %q", k, out[0], err, mem.Bytes()[:15])
	}
}

// TestStartFailsClean: a Start that fails after opening the RNIC closes it
// again: the TCP address the first attempt's soft RNIC listened on is free
// for the second. A provider Start does not know is refused.
func TestStartFailsClean(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	notSock := filepath.Join(dir, "file")
	if err := os.WriteFile(notSock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	nc := daemon.NodeConfig{Node: 1, Device: daemon.DeviceConfig{Listen: addr},
		Config: daemon.Config{Socket: notSock, Logger: slog.New(slog.DiscardHandler)}}
	if _, err := daemon.Start(ctx, nc); !errors.Is(err, daemon.ErrNotSocket) {
		t.Fatalf("Start on a regular file: %v, want ErrNotSocket", err)
	}
	nc.Socket = filepath.Join(dir, "krcored.sock")
	n, err := daemon.Start(ctx, nc)
	if err != nil {
		t.Fatalf("Start again on %s: %v (the failed Start kept its RNIC)", addr, err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("Close without Serve: %v", err)
	}
	nc.Device = daemon.DeviceConfig{Provider: "nic"}
	if _, err := daemon.Start(ctx, nc); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("Start with provider %q: %v, want ErrInvalid", nc.Device.Provider, err)
	}
}
