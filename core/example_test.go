package core_test

import (
	"context"
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// Two runtimes built by hand, each on its own soft RNIC of one fabric: the
// first embeds the MetaServer (Config.Meta empty), the second names it.
// From Embed on, the code is the root package's (see its examples); it
// would run unchanged on krcored.
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fabric := soft.NewFabric()
	dev1, _ := fabric.NewNode(soft.Config{Name: "node1"})
	defer dev1.Close()
	dev2, _ := fabric.NewNode(soft.Config{Name: "node2"})
	defer dev2.Close()

	rt1, err := core.New(ctx, core.Config{Device: dev1, Node: 1})
	if err != nil {
		panic(err)
	}
	defer rt1.Close()
	rt2, err := core.New(ctx, core.Config{Device: dev2, Node: 2, Meta: []meta.Info{rt1.MetaInfo()}})
	if err != nil {
		panic(err)
	}
	defer rt2.Close()

	var server, client krcore.API = core.Embed(rt1), core.Embed(rt2)
	mem, _ := server.RegMR(64, verbs.AccessAll)
	copy(mem.Bytes(), "counter")
	server.Export("counter", mem, 0, 64, verbs.AccessRemoteAtomic)

	q, _ := client.Queue()
	defer q.Close()
	q.Connect(ctx, server.Node(), nil) // one READ of node 1's MetaServer table
	g, _ := q.Region(ctx, "counter")
	old, _ := client.RegMR(8, verbs.AccessLocalWrite)
	for i := range 3 {
		q.Push(ctx, true, krcore.Request{ID: uint64(i), Op: verbs.OpFetchAdd, Local: old.Range(0, 8), Remote: g.At(8), Compare: 10})
		var out [1]krcore.Completion
		q.PopWait(ctx, out[:])
		fmt.Println(out[0].Status, old.Bytes()[0])
	}
	// Output:
	// SUCCESS 0
	// SUCCESS 10
	// SUCCESS 20
}
