package core

import (
	"context"
	"testing"
	"time"

	"github.com/krcore/krcore/meta"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestBuildRCCall: the RC handshake over the control port connects both
// ends and puts the QP in the initiator's pool.
func TestBuildRCCall(t *testing.T) {
	fab := soft.NewFabric()
	d1, _ := fab.NewNode(soft.Config{})
	d2, _ := fab.NewNode(soft.Config{})
	defer d1.Close()
	defer d2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	path := verbs.Path{Timeout: 50 * time.Millisecond, RetryCount: 3}
	a, _ := New(ctx, Config{Device: d1, Node: 1, Path: path, RCPeers: -1})
	defer a.Close()
	b, _ := New(ctx, Config{Device: d2, Node: 2, Path: path, Meta: []meta.Info{a.MetaInfo()}, RCPeers: -1})
	defer b.Close()
	p, err := a.peerFor(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.buildRC(ctx, p); err != nil {
		t.Fatal(err)
	}
	if len(p.rcs()) != 1 {
		t.Fatal("no RC")
	}
}
