package krcore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// readAt is application code: it knows only package krcore, so it runs on
// the embedded runtime (core.Embed) and on krcored (client.Attach) alike.
func readAt(ctx context.Context, api krcore.API, node krcore.NodeID, name string, n int) ([]byte, error) {
	q, err := api.Queue()
	if err != nil {
		return nil, err
	}
	defer q.Close()
	if err := q.Connect(ctx, node, nil); err != nil {
		return nil, err
	}
	region, err := q.Region(ctx, name)
	if err != nil {
		return nil, err
	}
	buf, err := api.RegMR(n, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	defer api.Deregister(buf)
	req := krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, n), Remote: region.At(0)}
	if _, err := q.Push(ctx, true, req); err != nil {
		return nil, err
	}
	var out [1]krcore.Completion
	if _, err := q.PopWait(ctx, out[:]); err != nil {
		return nil, err
	}
	return append([]byte(nil), buf.Bytes()[:n]...), out[0].Err()
}

// Node 2 exports memory under a name; node 1 reads it with one RDMA READ
// through a virtual queue, knowing only the node id and the name.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	server, client := core.Embed(c.Node(2)), core.Embed(c.Node(1))

	mem, _ := server.RegMR(4096, verbs.AccessAll)
	copy(mem.Bytes(), "hello from node 2")
	server.Export("greeting", mem, 0, 4096, verbs.AccessRemoteRead)

	b, err := readAt(ctx, client, 2, "greeting", 17)
	fmt.Println(string(b), err)

	_, err = readAt(ctx, client, 2, "nothing", 8)
	fmt.Println(errors.Is(err, krcore.ErrNoRegion))
	// Output:
	// hello from node 2 <nil>
	// true
}

// Two-sided messages: node 2 binds a port and posts a buffer; node 1
// connects to that port and SENDs, with immediate data.
func ExampleVQ_Bind() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	server, client := core.Embed(c.Node(2)), core.Embed(c.Node(1))

	srv, _ := server.Queue()
	defer srv.Close()
	srv.Bind(80)
	inbox, _ := server.RegMR(1024, verbs.AccessLocalWrite)
	srv.PushRecv(inbox.Range(0, 1024))

	cli, _ := client.Queue()
	defer cli.Close()
	cli.Connect(ctx, 2, &krcore.ConnectOptions{Port: 80})
	msg, _ := client.RegMR(64, verbs.AccessLocalWrite)
	n := copy(msg.Bytes(), "GET /")
	cli.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpSendImm, Imm: 7, Local: msg.Range(0, n)})

	var m [1]krcore.Message
	srv.PopMsgsWait(ctx, m[:])
	fmt.Printf("from node %d, imm %d: %s\n", m[0].From, m[0].Imm, inbox.Bytes()[:m[0].Len])
	// Output: from node 1, imm 7: GET /
}

// A caller sends a request and takes the answer, which comes to the port
// its queue holds, with one wait for both: the request's completion and
// the reply may come in either order.
func ExampleVQ_PopAnyWait() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	caller, server := core.Embed(c.Node(1)), core.Embed(c.Node(2))

	srv, _ := server.Queue() // the server answers at port 9, to port 8
	defer srv.Close()
	srv.Bind(9)
	srv.Connect(ctx, 1, &krcore.ConnectOptions{Port: 8})
	sbuf, _ := server.RegMR(64, verbs.AccessLocalWrite)
	srv.PushRecv(sbuf.Range(0, 32))

	q, _ := caller.Queue()
	defer q.Close()
	q.Bind(8)
	q.Connect(ctx, 2, &krcore.ConnectOptions{Port: 9})
	buf, _ := caller.RegMR(64, verbs.AccessLocalWrite)
	q.PushRecv(buf.Range(32, 32)) // the reply lands here
	copy(buf.Bytes(), "ping")
	q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: buf.Range(0, 4)})

	served := make(chan struct{})
	go func() { // the server: echo one message
		defer close(served)
		var in [1]krcore.Message
		if _, err := srv.PopMsgsWait(ctx, in[:]); err == nil {
			copy(sbuf.Bytes()[32:], "pong")
			srv.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: sbuf.Range(32, 4)})
		}
	}()

	var out [1]krcore.Completion
	var msgs [1]krcore.Message
	sent, replied := false, false
	for !sent || !replied {
		nc, nm, err := q.PopAnyWait(ctx, out[:], msgs[:])
		if err != nil {
			panic(err)
		}
		sent, replied = sent || nc > 0, replied || nm > 0
	}
	<-served
	m := msgs[0]
	fmt.Println(out[0].Err(), string(m.Buf.MR.Bytes()[m.Buf.Off:m.Buf.Off+m.Len]))
	// Output: <nil> pong
}
