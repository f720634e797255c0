package meta_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/soft"
)

// A MetaServer on one node of an in-process fabric; a second node
// registers its DC target and a third looks it up with one RDMA READ.
func Example() {
	fab := soft.NewFabric()
	serverNode, _ := fab.NewNode(soft.Config{Name: "meta"})
	defer serverNode.Close()
	nodeA, _ := fab.NewNode(soft.Config{Name: "a"})
	defer nodeA.Close()
	nodeB, _ := fab.NewNode(soft.Config{Name: "b"})
	defer nodeB.Close()

	srv, err := meta.NewServer(serverNode, meta.ServerConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	// Info travels to clients out of band: a flag, a config file.
	info, _ := meta.ParseInfo(srv.Info().String())

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	a, err := meta.NewClient(nodeA, []meta.Info{info}, meta.ClientConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	// Node 1 lives on nodeA; its DCT number and key are its runtime's.
	rec := meta.NewRecord(1, nodeA.Port(), 0x1234, 0xfeedbeef)
	if err := a.Register(ctx, rec, 10*time.Second); err != nil {
		log.Fatal(err)
	}

	b, err := meta.NewClient(nodeB, []meta.Info{info}, meta.ClientConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	got, err := b.Lookup(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("node %d: %s DCT %#x key %#x\n", got.Node, got.Addr, got.DCTNum, got.DCKey)
	b.Lookup(ctx, 1) // served from the cache
	st := b.Stats()
	fmt.Printf("hits %d misses %d READs %d\n", st.Hits, st.Misses, st.Reads)
	// Output:
	// node 1: mem:a DCT 0x1234 key 0xfeedbeef
	// hits 1 misses 1 READs 1
}
