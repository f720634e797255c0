package core_test

import (
	"context"
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/verbs"
)

// A two-node in-process cluster: node 2 exports memory, node 1 connects a
// virtual queue to it and reads and writes it with one-sided RDMA.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	server, client := c.Node(2), c.Node(1)

	mem, _ := server.RegMR(4096, verbs.AccessAll)
	copy(mem.Bytes(), "hello from node 2")
	server.Export("greeting", mem, 0, 4096, verbs.AccessRemoteRead|verbs.AccessRemoteWrite)

	q, _ := client.Queue()
	defer q.Close()
	if err := q.Connect(ctx, 2, nil); err != nil { // no handshake with node 2
		panic(err)
	}
	region, err := client.Region(ctx, 2, "greeting")
	if err != nil {
		panic(err)
	}
	buf, _ := client.RegMR(64, verbs.AccessAll)
	q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 17), Remote: region.At(0)})
	var out [1]krcore.Completion
	q.PopWait(ctx, out[:])
	fmt.Println(out[0].Status, string(buf.Bytes()[:17]))
	// Output: SUCCESS hello from node 2
}

// Two-sided messages: node 2 binds a port, node 1 connects to it and sends.
func ExampleQueue_Bind() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	srv, _ := c.Node(2).Queue()
	defer srv.Close()
	srv.Bind(80)
	inbox, _ := c.Node(2).RegMR(1024, verbs.AccessLocalWrite)
	srv.PushRecv(inbox.Range(0, 1024))

	cli, _ := c.Node(1).Queue()
	defer cli.Close()
	cli.Connect(ctx, 2, &krcore.ConnectOptions{Port: 80})
	msg, _ := c.Node(1).RegMR(64, verbs.AccessLocalWrite)
	n := copy(msg.Bytes(), "GET /")
	cli.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: msg.Range(0, n)})

	var m [1]krcore.Message
	srv.PopMsgsWait(ctx, m[:])
	fmt.Printf("from node %d: %s\n", m[0].From, inbox.Bytes()[:m[0].Len])
	// Output: from node 1: GET /
}
