package meta

import (
	"errors"
	"testing"

	"github.com/krcore/krcore/provider/soft"
)

// noDCNodes starts nodes on a new in-process fabric; those whose index is
// in noDC lack DC, as rxe does.
func noDCNodes(t testing.TB, n int, noDC ...int) []*soft.Node {
	t.Helper()
	fab := soft.NewFabric()
	nodes := make([]*soft.Node, n)
	for i := range nodes {
		cfg := soft.Config{RetryTimeout: testRetry}
		for _, k := range noDC {
			cfg.NoDC = cfg.NoDC || k == i
		}
		nd, err := fab.NewNode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		nodes[i] = nd
	}
	return nodes
}

// TestLookupOverRC: without DC on either side (or with RCReads), a client
// READs the table over an RC QP that one UD handshake set up; every lookup
// after that costs one READ and no handshake.
func TestLookupOverRC(t *testing.T) {
	cases := []struct {
		name    string
		noDC    []int // 0 server, 1 client
		rcReads bool
	}{
		{"both without DC", []int{0, 1}, false},
		{"server without DC", []int{0}, false},
		{"client without DC", []int{1}, false},
		{"RCReads on DC devices", nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := noDCNodes(t, 2, tc.noDC...)
			ctx := testCtx(t)
			srv := startServer(t, nodes[0], ServerConfig{})
			cfg := fastClient
			cfg.RCReads = tc.rcReads
			c := startClient(t, nodes[1], []Info{srv.Info()}, cfg)
			if err := c.Register(ctx, recordOf(nodes[1], 7), 0); err != nil {
				t.Fatal(err)
			}
			if err := c.Hello(ctx); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if r, err := c.Fetch(ctx, 7); err != nil || r.Node != 7 {
					t.Fatalf("fetch %d: %+v, %v", i, r, err)
				}
			}
			if st := c.Stats(); st.Reads != 3 || st.Connects != 1 {
				t.Fatalf("stats %+v: want 3 READs over one RC connection", st)
			}
			if n := srv.Stats().Readers; n != 1 {
				t.Fatalf("server keeps %d readers, want 1", n)
			}
			if _, err := c.Fetch(ctx, 8); !errors.Is(err, ErrNotFound) {
				t.Fatalf("fetch of an unregistered node: %v", err)
			}
		})
	}
}

// TestRCReaderReplaced: a server bounds its RC readers; a client whose
// reader was closed to make room connects a new one on its next lookup,
// which still succeeds.
func TestRCReaderReplaced(t *testing.T) {
	nodes := noDCNodes(t, 3, 0, 1, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{MaxReaders: 1})
	a := startClient(t, nodes[1], []Info{srv.Info()}, fastClient)
	b := startClient(t, nodes[2], []Info{srv.Info()}, fastClient)
	if err := a.Register(ctx, recordOf(nodes[1], 1), 0); err != nil {
		t.Fatal(err)
	}
	for i, c := range []*Client{a, b, a} {
		if _, err := c.Fetch(ctx, 1); err != nil {
			t.Fatalf("fetch %d: %v", i, err)
		}
	}
	if st := a.Stats(); st.Connects != 2 || st.Recoveries != 1 {
		t.Fatalf("client a: %+v, want 2 connects and 1 recovery", st)
	}
	if n := srv.Stats().Readers; n != 1 {
		t.Fatalf("server keeps %d readers, want 1", n)
	}
}
