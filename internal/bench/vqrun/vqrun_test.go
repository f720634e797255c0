package vqrun

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/verbs"
)

// TestLoops: on a two-node in-process cluster, Latency READs node 2's
// exported bytes one at a time, Stream WRITEs with a window and marks every
// completion up to the total, and Ping round trips come back from an Echo
// bound on node 2.
func TestLoops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, b := core.Embed(c.Node(1)), core.Embed(c.Node(2))
	mem, err := b.RegMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem.Bytes(), "node 2's bytes")
	if err := b.Export("vqrun", mem, 0, 4096, verbs.AccessRemoteRead|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	local, err := a.RegMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	q, err := a.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Connect(ctx, 2, nil); err != nil {
		t.Fatal(err)
	}
	g, err := q.Region(ctx, "vqrun")
	if err != nil {
		t.Fatal(err)
	}
	dl := rawqp.NewDeadline(ctx, 10*time.Second)
	defer dl.Close()
	poll := Poll{Spin: 20 * time.Microsecond, Yield: true}

	read := krcore.Request{Op: verbs.OpRead, Local: local.Range(0, 14), Remote: g.At(0)}
	lat, err := Latency(dl, q, poll, read, 2, 5)
	if err != nil || len(lat) != 5 || string(local.Bytes()[:14]) != "node 2's bytes" {
		t.Fatalf("READ latency: %d samples, %v, read %q", len(lat), err, local.Bytes()[:14])
	}
	copy(local.Bytes()[100:], "streamed")
	write := krcore.Request{Op: verbs.OpWrite, Local: local.Range(100, 8), Remote: g.At(200)}
	marks, err := Stream(dl, q, poll, write, 40, 8, 4)
	if err != nil || len(marks) < 2 || marks[len(marks)-1].Msgs != 40 || string(mem.Bytes()[200:208]) != "streamed" {
		t.Fatalf("WRITE stream: %v, marks %v, node 2 holds %q", err, marks, mem.Bytes()[200:208])
	}

	echo, err := NewEcho(b, 7, Poll{})
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	ping, err := NewPing(ctx, a, 8, 2, 7, poll)
	if err != nil {
		t.Fatal(err)
	}
	defer ping.Close()
	served := make(chan error, 1)
	go func() { served <- echo.Serve(ctx, 10, 10*time.Second) }()
	rtts, err := ping.Run(ctx, 64, 2, 8, 10*time.Second)
	if err != nil || len(rtts) != 8 {
		t.Fatalf("ping: %d round trips, %v", len(rtts), err)
	}
	if err := <-served; err != nil {
		t.Fatalf("echo: %v", err)
	}
}
