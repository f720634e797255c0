package meta

import (
	"errors"
	"testing"
	"time"
)

// fetchable waits until c's Fetch of node answers want (found or not).
func fetchable(t *testing.T, c *Client, node uint64, found bool) Record {
	t.Helper()
	var rec Record
	eventually(t, 5*time.Second, "record of node mirrored", func() bool {
		r, err := c.Fetch(testCtx(t), node)
		if found && err == nil {
			rec = r
			return true
		}
		return !found && errors.Is(err, ErrNotFound)
	})
	return rec
}

// TestMembershipMirror: two MetaServers fed by one Membership serve the
// same records; a record registered in the store appears in both tables,
// a changed one is rewritten in place, a withdrawn or lapsed one goes; a
// server started later (a restart) rebuilds its table from the store; UD
// registrations are refused; both servers announce themselves.
func TestMembershipMirror(t *testing.T) {
	nodes := memNodes(t, 4)
	ctx := testCtx(t)
	m := NewMemMembership()
	a := startServer(t, nodes[0], ServerConfig{Membership: m})
	b := startServer(t, nodes[1], ServerConfig{Membership: m})
	ca := startClient(t, nodes[3], []Info{a.Info()}, fastClient)
	cb := startClient(t, nodes[3], []Info{b.Info()}, fastClient)

	rec := recordOf(nodes[2], 7)
	lease, err := m.Register(ctx, rec, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Client{ca, cb} {
		if got := fetchable(t, c, 7, true); withVersion(got, 0) != rec {
			t.Fatalf("mirrored %+v, want %+v", got, rec)
		}
	}
	if _, err := m.Register(ctx, recordOf(nodes[3], 7), time.Second); !errors.Is(err, ErrNodeInUse) {
		t.Fatalf("second node at another address: %v, want ErrNodeInUse", err)
	}
	moved := rec
	moved.DCTNum++
	lease2, err := m.Register(ctx, moved, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "changed record", func() bool {
		r, err := ca.Fetch(ctx, 7)
		return err == nil && r.DCTNum == moved.DCTNum
	})
	lease.Close(ctx) // the old registration no longer holds the record
	if _, err := cb.Fetch(ctx, 7); err != nil {
		t.Fatalf("closing a replaced lease withdrew the live record: %v", err)
	}

	if err := ca.Register(ctx, recordOf(nodes[3], 9), 0); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("UD Register to a mirroring server: %v, want ErrBadRecord (refused)", err)
	}

	// A restart: a new server on a's device rebuilds from the store.
	a.Close()
	a2 := startServer(t, nodes[0], ServerConfig{Membership: m})
	c2 := startClient(t, nodes[3], []Info{a2.Info()}, fastClient)
	fetchable(t, c2, 7, true)
	if src := a2.Source(); src != "memory" {
		t.Fatalf("Source = %q", src)
	}
	eventually(t, 5*time.Second, "servers announced", func() bool {
		infos, _ := m.Servers(ctx)
		return len(infos) == 2 && infos[0] == b.Info() && infos[1] == a2.Info()
	})

	m.Expire(7) // the node died: its lease lapsed
	fetchable(t, cb, 7, false)
	fetchable(t, c2, 7, false)
	if n := b.Stats().Records; n != 0 {
		t.Fatalf("%d records after the lease lapsed", n)
	}
	if err := lease2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lease2.Close(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

// TestMirrorReset: a Reset update replaces the table's whole content, as
// after a broken watch.
func TestMirrorReset(t *testing.T) {
	nodes := memNodes(t, 1)
	s := &Server{entries: make(map[uint64]*entry)}
	var err error
	if s.tbl, err = newTable(make([]byte, tableBytes(4, 2)), 4, 2); err != nil {
		t.Fatal(err)
	}
	s.mirror(Update{Put: []Record{recordOf(nodes[0], 1), recordOf(nodes[0], 2), {Node: 0}}})
	s.mirror(Update{Reset: true, Put: []Record{recordOf(nodes[0], 2), recordOf(nodes[0], 3)}})
	s.mirror(Update{Gone: []uint64{3, 99}})
	if len(s.entries) != 1 || s.entries[2] == nil || s.tbl.find(1) >= 0 || s.tbl.find(3) >= 0 || s.tbl.find(2) < 0 {
		t.Fatalf("entries %v: want node 2 alone", s.entries)
	}
	if s.stats.dropped.Load() != 1 {
		t.Fatalf("an invalid record (node 0) must be dropped, counted %d", s.stats.dropped.Load())
	}
}
