// Package testcluster starts the clusters the layers above krcore test
// on: soft-RNIC nodes in one process, krcored serving node 1, and the
// runtimes a test reaches them through, each stopped by t.Cleanup. It is
// for tests only.
package testcluster

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/daemon/wire"
)

// setupTimeout bounds starting a cluster or attaching a client.
const setupTimeout = 20 * time.Second

// StartDaemon starts a cluster of nodes nodes and krcored on node 1, and
// returns the cluster and krcored's socket.
func StartDaemon(t testing.TB, nodes int) (*cluster.Cluster, string) {
	t.Helper()
	c, _, sock := StartDaemonServer(t, nodes)
	return c, sock
}

// StartDaemonServer is StartDaemon, with krcored's server, for a test that
// stops it early (Close may be called again).
func StartDaemonServer(t testing.TB, nodes int) (*cluster.Cluster, *daemon.Server, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	srv, err := daemon.New(c.Node(1), daemon.Config{Socket: sock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return c, srv, sock
}

// Attach is a new client of the krcored serving sock: another process, as
// krcored sees it.
func Attach(t testing.TB, sock string) krcore.API {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	cl, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// APIs starts a cluster of nodes nodes and returns the embedded runtimes
// of nodes 2, 3, ... and node 1's runtime two ways, keyed "embedded" and
// "daemon" (through krcored), so a test runs each case both ways.
func APIs(t testing.TB, nodes int) ([]krcore.API, map[string]krcore.API) {
	t.Helper()
	c, sock := StartDaemon(t, nodes)
	var others []krcore.API
	for id := krcore.NodeID(2); id <= krcore.NodeID(nodes); id++ {
		others = append(others, core.Embed(c.Node(id)))
	}
	return others, map[string]krcore.API{"embedded": core.Embed(c.Node(1)), "daemon": Attach(t, sock)}
}

// DaemonRegions is how many regions krcored holds for api, its client (as
// the client's own status shows it); 0 for an embedded runtime.
func DaemonRegions(t testing.TB, api krcore.API) int {
	t.Helper()
	c, ok := api.(*client.Client)
	if !ok {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	b, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var st wire.Status
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	for _, cs := range st.Clients {
		if cs.ID == c.ID() {
			return cs.Regions
		}
	}
	t.Fatalf("krcored does not list client %d", c.ID())
	return 0
}
