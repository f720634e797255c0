package meta

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// testRetry bounds how long a soft RNIC waits for a dead peer.
const testRetry = 300 * time.Millisecond

// fastClient fails over and retries quickly, so tests of dead servers are
// short.
var fastClient = ClientConfig{ReadTimeout: 200 * time.Millisecond, RequestTimeout: 20 * time.Millisecond, Attempts: 4}

// memNodes starts nodes on a new in-process fabric.
func memNodes(t testing.TB, n int) []*soft.Node {
	t.Helper()
	fab := soft.NewFabric()
	nodes := make([]*soft.Node, n)
	for i := range nodes {
		nd, err := fab.NewNode(soft.Config{RetryTimeout: testRetry})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		nodes[i] = nd
	}
	return nodes
}

// tcpNodes starts nodes reachable only over loopback TCP.
func tcpNodes(t testing.TB, n int) []*soft.Node {
	t.Helper()
	nodes := make([]*soft.Node, n)
	for i := range nodes {
		nd, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: testRetry})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		nodes[i] = nd
	}
	return nodes
}

// fabrics are the two wires every end-to-end test runs on.
var fabrics = map[string]func(testing.TB, int) []*soft.Node{"mem": memNodes, "tcp": tcpNodes}

func startServer(t testing.TB, dev verbs.Device, cfg ServerConfig) *Server {
	t.Helper()
	s, err := NewServer(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func startClient(t testing.TB, dev verbs.Device, servers []Info, cfg ClientConfig) *Client {
	t.Helper()
	c, err := NewClient(dev, servers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// recordOf is a plausible record for node living on dev.
func recordOf(dev verbs.Device, node uint64) Record {
	return NewRecord(node, dev.Port(), uint32(0x100+node), 0xdc00+node)
}

// eventually polls cond (never spinning: every 5ms) until it holds or the
// deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
