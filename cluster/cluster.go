// Package cluster starts in-process krcore clusters: several soft RNIC nodes
// on one in-memory fabric, each with a KRCore runtime, sharing the MetaServer
// embedded in the first. Tests, examples and benchmarks use it; a real
// deployment runs one runtime per node (embedded or in krcored).
package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/provider/soft"
)

// Config shapes a cluster.
type Config struct {
	// Nodes is the number of nodes; ids are 1..Nodes.
	Nodes int
	// Runtime is the template for every node's runtime; Device, Node and
	// Meta are filled in.
	Runtime core.Config
	// Soft is the template for every soft RNIC; Name is filled in.
	Soft soft.Config
	// Fabric, if set, is used instead of a new in-memory fabric.
	Fabric *soft.Fabric
}

// Cluster is a running in-process cluster.
type Cluster struct {
	Fabric   *soft.Fabric
	Devices  []*soft.Node
	Runtimes []*core.Runtime
}

// Start brings up cfg.Nodes nodes. Node 1 embeds the MetaServer.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Nodes <= 0 {
		return nil, fmt.Errorf("cluster: %d nodes", cfg.Nodes)
	}
	c := &Cluster{Fabric: cfg.Fabric}
	if c.Fabric == nil {
		c.Fabric = soft.NewFabric()
	}
	if cfg.Soft.RetryTimeout == 0 {
		cfg.Soft.RetryTimeout = time.Second
	}
	for i := 1; i <= cfg.Nodes; i++ {
		if err := c.Add(ctx, cfg, core.NodeID(i)); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Add starts one more node with the given id.
func (c *Cluster) Add(ctx context.Context, cfg Config, id core.NodeID) error {
	sc := cfg.Soft
	sc.Name = fmt.Sprintf("node%d-%p", id, c)
	dev, err := c.Fabric.NewNode(sc)
	if err != nil {
		return fmt.Errorf("cluster: node %d: %w", id, err)
	}
	rc := cfg.Runtime
	rc.Device, rc.Node = dev, id
	if len(c.Runtimes) > 0 {
		rc.Meta = append(rc.Meta[:0:0], c.Runtimes[0].MetaInfo())
	}
	rt, err := core.New(ctx, rc)
	if err != nil {
		dev.Close()
		return fmt.Errorf("cluster: node %d: %w", id, err)
	}
	c.Devices = append(c.Devices, dev)
	c.Runtimes = append(c.Runtimes, rt)
	return nil
}

// Node returns the runtime of node id.
func (c *Cluster) Node(id core.NodeID) *core.Runtime {
	for _, rt := range c.Runtimes {
		if rt.Node() == id {
			return rt
		}
	}
	return nil
}

// Close stops every node, the MetaServer's last.
func (c *Cluster) Close() error {
	for i := len(c.Runtimes) - 1; i >= 0; i-- {
		c.Runtimes[i].Close()
		c.Devices[i].Close()
	}
	c.Runtimes, c.Devices = nil, nil
	return nil
}
