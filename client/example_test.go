package client_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/verbs"
)

// readGreeting is application code: it runs on any krcore.API, the embedded
// runtime or a daemon client.
func readGreeting(ctx context.Context, api krcore.API) (string, error) {
	q, err := api.Queue()
	if err != nil {
		return "", err
	}
	defer q.Close()
	if err := q.Connect(ctx, 2, nil); err != nil {
		return "", err
	}
	g, err := q.Region(ctx, "greeting")
	if err != nil {
		return "", err
	}
	buf, err := api.RegMR(64, verbs.AccessAll)
	if err != nil {
		return "", err
	}
	defer api.Deregister(buf)
	if _, err := q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 17), Remote: g.At(0)}); err != nil {
		return "", err
	}
	var out [1]krcore.Completion
	if _, err := q.PopWait(ctx, out[:]); err != nil {
		return "", err
	}
	return string(buf.Bytes()[:17]), out[0].Err()
}

// The same code on the runtime embedded in the process and on krcored,
// which a real deployment runs as its own process (cmd/krcored).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _ := cluster.Start(ctx, cluster.Config{Nodes: 2})
	defer c.Close()
	mem, _ := c.Node(2).RegMR(4096, verbs.AccessAll)
	copy(mem.Bytes(), "hello from node 2")
	c.Node(2).Export("greeting", mem, 0, 4096, verbs.AccessRemoteRead)

	dir, _ := os.MkdirTemp("", "krcored")
	defer os.RemoveAll(dir)
	srv, _ := daemon.New(c.Node(1), daemon.Config{Socket: filepath.Join(dir, "krcored.sock")})
	go srv.Serve(ctx)
	defer srv.Close()

	attached, err := client.Attach(ctx, client.Options{Socket: srv.Socket()})
	if err != nil {
		panic(err)
	}
	defer attached.Close()
	for _, api := range []krcore.API{core.Embed(c.Node(1)), attached} {
		s, err := readGreeting(ctx, api)
		fmt.Println(s, err)
	}
	// Output:
	// hello from node 2 <nil>
	// hello from node 2 <nil>
}
