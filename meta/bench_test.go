package meta

import (
	"context"
	"runtime"
	"testing"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// benchSetup is a server node with one registered record and a client
// node whose client already knows the server's geometry.
func benchSetup(b *testing.B, mk func(testing.TB, int) []*soft.Node) (*Server, *Client, []*soft.Node) {
	nodes := mk(b, 2)
	srv := startServer(b, nodes[0], ServerConfig{})
	c := startClient(b, nodes[1], []Info{srv.Info()}, ClientConfig{})
	ctx := context.Background()
	if err := c.Register(ctx, recordOf(nodes[1], 1), 0); err != nil {
		b.Fatal(err)
	}
	if _, err := c.Fetch(ctx, 1); err != nil {
		b.Fatal(err)
	}
	return srv, c, nodes
}

// BenchmarkFetch is one uncached lookup: one READ of a bucket (512 B) plus
// the scan, through the client's shared DCI and poller.
func BenchmarkFetch(b *testing.B) {
	for name, mk := range fabrics {
		b.Run(name, func(b *testing.B) {
			_, c, _ := benchSetup(b, mk)
			ctx := context.Background()
			for b.Loop() {
				if _, err := c.Fetch(ctx, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLookup is a cached lookup.
func BenchmarkLookup(b *testing.B) {
	_, c, _ := benchSetup(b, memNodes)
	ctx := context.Background()
	for b.Loop() {
		if _, err := c.Lookup(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenew is one two-sided UD request and reply: what a lookup
// would cost as an RPC instead of a READ.
func BenchmarkRenew(b *testing.B) {
	for name, mk := range fabrics {
		b.Run(name, func(b *testing.B) {
			_, c, nodes := benchSetup(b, mk)
			ctx := context.Background()
			rec := recordOf(nodes[1], 1)
			for b.Loop() {
				if _, err := c.conns[0].renew(ctx, rec, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRead8 is a plain synchronous 8 B RDMA READ over a DCI from the
// same client node to the same server node (the server's table DCT), with
// the same spin-then-wait completion strategy: the baseline a Fetch is
// compared to.
func BenchmarkRead8(b *testing.B) {
	for name, mk := range fabrics {
		b.Run(name, func(b *testing.B) {
			srv, _, nodes := benchSetup(b, mk)
			r := newRawDCI(b, nodes[1], srv)
			for b.Loop() {
				r.read8()
			}
		})
	}
}

// rawDCI is a bare DCI reading the server's table.
type rawDCI struct {
	b   testing.TB
	dci verbs.QP
	cq  verbs.CQ
	wr  []verbs.SendWR
	wcs []verbs.WC
}

func newRawDCI(b testing.TB, dev verbs.Device, srv *Server) *rawDCI {
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	pd, err := dev.AllocPD()
	must(err)
	cq, err := dev.CreateCQ(16)
	must(err)
	dci, err := pd.CreateQP(verbs.QPInit{Type: verbs.DCI, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	must(err)
	must(verbs.Ready(dci, verbs.Path{}))
	blk, err := offheap.Alloc(64)
	must(err)
	mr, err := pd.RegMR(blk.Bytes(), verbs.AccessLocalWrite)
	must(err)
	ah, err := pd.CreateAH(verbs.AHAttr{Dest: srv.Info().endpoint()})
	must(err)
	b.Cleanup(func() {
		dci.Close()
		ah.Close()
		mr.Close()
		cq.Close()
		pd.Close()
		blk.Close()
	})
	g := srv.geo
	return &rawDCI{b: b, dci: dci, cq: cq, wcs: make([]verbs.WC, 1), wr: []verbs.SendWR{{
		ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(mr, 0, 8)},
		RemoteAddr: g.addr, RKey: g.rkey, AH: ah, RemoteQPN: g.dct, DCKey: g.dcKey,
	}}}
}

func (r *rawDCI) read8() {
	if _, err := r.dci.PostSend(r.wr); err != nil {
		r.b.Fatal(err)
	}
	for idle := 0; ; idle++ {
		n, err := r.cq.Poll(r.wcs)
		if err != nil {
			r.b.Fatal(err)
		}
		if n == 1 {
			if r.wcs[0].Status != verbs.Success {
				r.b.Fatal(r.wcs[0].Status)
			}
			return
		}
		if idle < 32 { // as udrpc's pollers spin
			runtime.Gosched()
			continue
		}
		if err := r.cq.Wait(context.Background()); err != nil {
			r.b.Fatal(err)
		}
	}
}
