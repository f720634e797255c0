package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestForeignRefused: a runtime refuses, as protection and not with a
// panic, memory and regions that are not its own, and the shared QP keeps
// serving the next request.
func TestForeignRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n1, n2, n3 := c.Node(1), c.Node(2), c.Node(3)
	mem, _ := n2.RegMR(4096, verbs.AccessAll)
	if err := n2.Export("r", mem, 0, 4096, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	mem3, _ := n3.RegMR(4096, verbs.AccessAll)
	n3.Export("r", mem3, 0, 4096, verbs.AccessRemoteRead)
	api := core.Embed(n1)
	q, err := api.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Connect(ctx, 2, nil); err != nil {
		t.Fatal(err)
	}
	g, err := q.Region(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	g3, err := n1.Region(ctx, 3, "r")
	if err != nil {
		t.Fatal(err)
	}
	own, _ := api.RegMR(64, verbs.AccessAll)
	other, _ := n2.RegMR(64, verbs.AccessAll)
	handle := forgedMR(make([]byte, 64))
	hregion := forgedRegion{g}
	reqs := []krcore.Request{
		{ID: 1, Op: verbs.OpRead, Local: other.Range(0, 8), Remote: g.At(0)},
		{ID: 2, Op: verbs.OpRead, Local: handle.Range(0, 8), Remote: g.At(0)},
		{ID: 3, Op: verbs.OpRead, Local: own.Range(0, 8), Remote: hregion.At(0)},
		{ID: 4, Op: verbs.OpRead, Local: own.Range(0, 8), Remote: g3.At(0)},
		{ID: 5, Op: verbs.OpRead, Local: own.Range(0, 8), Remote: g.At(0)},
	}
	want := []verbs.Status{verbs.LocProtErr, verbs.LocProtErr, verbs.RemInvReqErr, verbs.RemAccessErr, verbs.Success}
	if _, err := q.Push(ctx, true, reqs...); err != nil {
		t.Fatal(err)
	}
	out := make([]krcore.Completion, 8)
	for got := 0; got < len(want); {
		n, err := q.PopWait(ctx, out[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	for i, w := range want {
		if out[i].ID != uint64(i+1) || out[i].Status != w {
			t.Errorf("completion %d: %+v, want status %s", i, out[i], w)
		}
	}
	if err := api.Export("x", handle, 0, 8, verbs.AccessRemoteRead); !errors.Is(err, krcore.ErrRefused) {
		t.Errorf("export of a handle MR: %v, want ErrRefused", err)
	}
	if err := api.Deregister(other); !errors.Is(err, krcore.ErrRefused) {
		t.Errorf("deregister of another runtime's MR: %v, want ErrRefused", err)
	}
	if err := q.PushRecv(handle.Range(0, 8)); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("PushRecv of a handle MR: %v, want ErrInvalid", err)
	}
}

// forgedMR is an MR handle of the caller's own making over plain memory.
type forgedMR []byte

func (m forgedMR) Bytes() []byte                 { return m }
func (m forgedMR) Len() int                      { return len(m) }
func (forgedMR) Access() verbs.Access            { return verbs.AccessAll }
func (m forgedMR) Range(off, n int) krcore.Local { return krcore.Local{MR: m, Off: off, Len: n} }

// claimedRegion is a Region of the caller's own making that claims a
// node, a name, a length and rights.
type claimedRegion struct {
	node   krcore.NodeID
	name   string
	n      uint64
	access verbs.Access
}

func (g claimedRegion) Node() krcore.NodeID         { return g.node }
func (g claimedRegion) Name() string                { return g.name }
func (g claimedRegion) Len() uint64                 { return g.n }
func (g claimedRegion) Access() verbs.Access        { return g.access }
func (g claimedRegion) At(off uint64) krcore.Remote { return krcore.Remote{Region: g, Off: off} }

// forgedRegion claims to be a region the runtime learned, by wrapping one
// and reporting everything it does.
type forgedRegion struct{ krcore.Region }

func (g forgedRegion) At(off uint64) krcore.Remote { return krcore.Remote{Region: g, Off: off} }
