package lite_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/lite"
)

// Node 2 serves RPC 1 (upper-casing its request) with the combined
// reply-and-receive call; node 1 calls it. The first call sets up node 1's
// ring at node 2; each call is then one WRITE_WITH_IMM each way.
func ExampleNode_Call() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	server, _ := lite.Open(ctx, core.Embed(c.Node(2)), lite.Options{})
	defer server.Close()
	caller, _ := lite.Open(ctx, core.Embed(c.Node(1)), lite.Options{})
	defer caller.Close()

	svc, _ := server.RegisterRPC(1)
	go func() {
		call, err := svc.Recv(ctx)
		for err == nil {
			call, err = svc.ReplyRecv(ctx, call, []byte(strings.ToUpper(string(call.Req))))
		}
	}()

	resp := make([]byte, 64)
	k, err := caller.Call(ctx, 2, 1, []byte("hello rpc"), resp)
	fmt.Println(string(resp[:k]), err)

	_, err = caller.Call(ctx, 2, 1, []byte("too long for resp"), resp[:4])
	fmt.Println(errors.Is(err, lite.ErrTooLarge))

	_, err = caller.Call(ctx, 2, 42, nil, resp)
	fmt.Println(errors.Is(err, lite.ErrNoService))
	// Output:
	// HELLO RPC <nil>
	// true
	// true
}

// Node 2 opens an endpoint named "inbox"; node 1 sends it a message,
// which Send returns once the endpoint holds.
func ExampleNode_Send() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	receiver, _ := lite.Open(ctx, core.Embed(c.Node(2)), lite.Options{})
	defer receiver.Close()
	sender, _ := lite.Open(ctx, core.Embed(c.Node(1)), lite.Options{})
	defer sender.Close()

	ep, _ := receiver.Endpoint("inbox")
	err = sender.Send(ctx, 2, "inbox", []byte("hello endpoint"))
	fmt.Println(err)
	m, err := ep.Recv(ctx)
	fmt.Println(string(m.Data), m.From, err)

	err = sender.Send(ctx, 2, "nobody", []byte("lost?"))
	fmt.Println(errors.Is(err, lite.ErrNoEndpoint))
	// Output:
	// <nil>
	// hello endpoint 1 <nil>
	// true
}
