package verbs_test

import (
	"context"
	"fmt"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// Two RNICs, one RC connection, one RDMA WRITE: the verbs way, on the soft
// provider's in-memory fabric.
func Example() {
	fab := soft.NewFabric()
	a, _ := fab.NewNode(soft.Config{Name: "a"})
	b, _ := fab.NewNode(soft.Config{Name: "b"})
	defer a.Close()
	defer b.Close()

	type side struct {
		qp  verbs.QP
		cq  verbs.CQ
		mr  verbs.MR
		blk *offheap.Block
	}
	open := func(d verbs.Device) side {
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(16)
		qp, _ := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16}})
		blk, _ := offheap.Alloc(4096) // RNICs only register off-heap memory
		mr, _ := pd.RegMR(blk.Bytes(), verbs.AccessAll)
		return side{qp, cq, mr, blk}
	}
	x, y := open(a), open(b)
	// Exchange endpoints out of band (here: directly) and go to RTS.
	verbs.Connect(x.qp, y.qp.Endpoint(), verbs.Path{})
	verbs.Connect(y.qp, x.qp.Endpoint(), verbs.Path{})

	copy(x.mr.Bytes(), "written by a")
	x.qp.PostSend([]verbs.SendWR{{
		ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled,
		SGL:        []verbs.SGE{verbs.SGEOf(x.mr, 0, 12)},
		RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey(),
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wc [1]verbs.WC
	for n, _ := x.cq.Poll(wc[:]); n == 0; n, _ = x.cq.Poll(wc[:]) {
		x.cq.Wait(ctx)
	}
	fmt.Println(wc[0].Status, string(y.mr.Bytes()[:12]))
	// Output: SUCCESS written by a
}

// Endpoints travel between peers as bytes or text.
func ExampleEndpoint() {
	ep := verbs.Endpoint{Addr: "10.0.0.1:7471", QPN: 0x1234, PSN: 42}
	b, _ := ep.MarshalBinary()
	var back verbs.Endpoint
	back.UnmarshalBinary(b)
	text, _ := verbs.ParseEndpoint(ep.String())
	fmt.Println(back == ep, text == ep)
	// Output: true true
}
