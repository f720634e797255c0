package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/soft"
)

// TestEmbeddedMetaTable: MetaBuckets and MetaSlots size the embedded
// MetaServer's table. One bucket of two slots holds the embedding node and
// one other; a third node's registration finds the table full.
func TestEmbeddedMetaTable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fabric := soft.NewFabric()
	start := func(node krcore.NodeID, cfg core.Config) (*core.Runtime, error) {
		dev, err := fabric.NewNode(soft.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		cfg.Device, cfg.Node = dev, node
		rt, err := core.New(ctx, cfg)
		if err == nil {
			t.Cleanup(func() { rt.Close() })
		}
		return rt, err
	}
	host, err := start(1, core.Config{MetaBuckets: 1, MetaSlots: 2})
	if err != nil {
		t.Fatal(err)
	}
	metas := []meta.Info{host.MetaInfo()}
	if _, err := start(2, core.Config{Meta: metas}); err != nil {
		t.Fatalf("second node in a table of 2 slots: %v", err)
	}
	if _, err := start(3, core.Config{Meta: metas}); !errors.Is(err, meta.ErrTableFull) {
		t.Fatalf("third node in a table of 2 slots: %v, want meta.ErrTableFull", err)
	}
}
