package client_test

import (
	"errors"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// TestAudience: through krcored, a region exported to a principal (node 1,
// port 9) is found only by the client whose VQ holds port 9: another
// client of the same daemon cannot take the port, and asking unbound,
// bound to another port or as the client (no port) gets ErrNoRegion. A
// client's own export to a principal is found only by that principal.
func TestAudience(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	data, _ := e.c.Node(2).RegMR(64, verbs.AccessAll)
	copy(data.Bytes(), "for port 9 of node 1")
	if err := e.c.Node(2).Export("closed", data, 0, 64, verbs.AccessRemoteRead, krcore.Principal{Node: 1, Port: 9}); err != nil {
		t.Fatal(err)
	}
	a, b := attach(t, e), attach(t, e)
	qa, _ := connect(t, ctx, a)
	if err := qa.Bind(9); err != nil {
		t.Fatal(err)
	}
	qb, _ := connect(t, ctx, b)
	if err := qb.Bind(9); !errors.Is(err, krcore.ErrPortInUse) {
		t.Fatalf("B binding A's port: %v, want ErrPortInUse", err)
	}
	if _, err := qb.Region(ctx, "closed"); !errors.Is(err, krcore.ErrNoRegion) {
		t.Errorf("B's unbound VQ found it: %v", err)
	}
	if _, err := b.Region(ctx, 2, "closed"); !errors.Is(err, krcore.ErrNoRegion) {
		t.Errorf("B asking as no port found it: %v", err)
	}
	if err := qb.Bind(10); err != nil {
		t.Fatal(err)
	}
	if _, err := qb.Region(ctx, "closed"); !errors.Is(err, krcore.ErrNoRegion) {
		t.Errorf("B's VQ bound to port 10 found it: %v", err)
	}
	if _, err := qb.Region(ctx, "table"); err != nil {
		t.Errorf("B's VQ bound to port 10, everyone-export: %v", err)
	}
	g, err := qa.Region(ctx, "closed")
	if err != nil {
		t.Fatalf("A, the principal: %v", err)
	}
	buf, _ := a.RegMR(64, verbs.AccessAll)
	out := run(t, ctx, qa, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 20), Remote: g.At(0)})
	if out[0].Err() != nil || string(buf.Bytes()[:20]) != "for port 9 of node 1" {
		t.Fatalf("A's READ: %v %q", out[0].Err(), buf.Bytes()[:20])
	}

	// A client's export to a principal at node 2.
	if err := a.Export("from-a", buf, 0, 64, verbs.AccessRemoteRead, krcore.Principal{Node: 2, Port: 33}); err != nil {
		t.Fatal(err)
	}
	if err := a.Export("bad", buf, 0, 8, verbs.AccessRemoteRead, krcore.Principal{Node: 2}); !errors.Is(err, krcore.ErrInvalid) {
		t.Errorf("export to port 0: %v, want ErrInvalid", err)
	}
	q2, err := e.c.Node(2).Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close()
	if err := q2.Connect(ctx, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := q2.Region(ctx, "from-a"); !errors.Is(err, krcore.ErrNoRegion) {
		t.Errorf("node 2 unbound found A's export: %v", err)
	}
	if err := q2.Bind(33); err != nil {
		t.Fatal(err)
	}
	if _, err := q2.Region(ctx, "from-a"); err != nil {
		t.Errorf("node 2 port 33, the principal: %v", err)
	}
}
