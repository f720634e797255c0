package smc_test

import (
	"context"
	"encoding/json"
	"expvar"
	"fmt"
	"io"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/smc"
)

// A server on node 2 and a client on node 1 talk through net.Conn; the
// bytes go by RDMA WRITE into each other's receive buffers, and a client
// without a runtime is served over TCP on the same port.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	srvNode, _ := smc.Open(core.Embed(c.Node(2)), smc.NodeOptions{})
	defer srvNode.Close()
	cliNode, _ := smc.Open(core.Embed(c.Node(1)), smc.NodeOptions{})
	defer cliNode.Close()

	ln, err := smc.Listen("tcp", "127.0.0.1:0", &smc.Options{Node: srvNode})
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				io.Copy(conn, conn) // echo
			}()
		}
	}()

	for _, opts := range []*smc.Options{{Node: cliNode}, {}} {
		conn, err := smc.DialContext(ctx, "tcp", ln.Addr().String(), opts)
		if err != nil {
			panic(err)
		}
		conn.Write([]byte("hello"))
		buf := make([]byte, 5)
		_, err = io.ReadFull(conn, buf)
		fmt.Println(string(buf), err, smc.ModeOf(conn))
		conn.Close()
	}
	// Output:
	// hello <nil> SMC
	// hello <nil> TCP: no krcore runtime (0x03030000)
}

// An embedded program has no krcored to report to: it publishes its
// Node's report itself, here under /debug/vars with expvar (krctl smc
// shows the same for programs running through krcored).
func ExampleNode_Report() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 1})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	node, err := smc.Open(core.Embed(c.Node(1)), smc.NodeOptions{})
	if err != nil {
		panic(err)
	}
	defer node.Close()
	expvar.Publish("smc", expvar.Func(func() any { return node.Report() }))

	var rep smc.Report
	json.Unmarshal([]byte(expvar.Get("smc").String()), &rep)
	fmt.Println(rep.Port == node.Port(), len(rep.Conns), rep.Stats.SMC)
	// Output: true 0 0
}
