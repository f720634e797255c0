package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/bench/vqrun"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/verbs"
)

// The raw-QP SEND round trip the lite-rpc series compares a lite RPC call
// with: an RC QP on the embedded mapper's RNIC connected to one on the
// master's RNIC, whose echo answers every SEND. The mapper asks the master
// for it with a lite RPC (liteRPCRawQP) carrying its QP's endpoint; the
// master answers with its own, so no other channel between the processes
// is needed.
const (
	liteRPCRawQP   uint32 = 2
	seriesQPSendRT        = "qp_send"
	rawDepth              = 16
	rawEchoIdle           = 10 * time.Second // an echo idle this long ends
)

// serveRawQP answers liteRPCRawQP calls on svc: for each, an RC QP on dev
// connected to the caller's, echoing on a goroutine e owns.
func (e *liteEchoes) serveRawQP(ctx context.Context, dev verbs.Device, svc *lite.Service) {
	for {
		call, err := svc.Recv(ctx)
		if err != nil {
			return
		}
		ep, err := rawEchoQP(ctx, dev, string(call.Req))
		if err != nil {
			svc.Reply(ctx, call, nil) // an empty endpoint: the caller fails
			continue
		}
		p := rawqp.NewPoller(ctx, ep.CQ, 0, rawEchoIdle, false)
		e.run(func() {
			defer ep.Close()
			defer p.Close()
			ep.EchoOp(p, rawqp.Spec{Op: verbs.OpSend, Size: liteRPCSize}, math.MaxInt) // ends when idle or stopped
		})
		svc.Reply(ctx, call, []byte(ep.QP.Endpoint().String()))
	}
}

// rawEchoQP makes an RC QP on dev, connected to the endpoint remote names,
// with receives posted.
func rawEchoQP(ctx context.Context, dev verbs.Device, remote string) (*rawqp.Endpoint, error) {
	peer, err := verbs.ParseEndpoint(remote)
	if err != nil {
		return nil, err
	}
	ep, err := rawqp.NewEndpoint(dev, nil, vqrun.MaxMessage, rawqp.Shape{SendDepth: rawDepth, RecvDepth: rawDepth})
	if err != nil {
		return nil, err
	}
	if err := ep.Connect(peer); err != nil {
		ep.Close()
		return nil, err
	}
	if err := ep.PostRecvs(rawDepth); err != nil {
		ep.Close()
		return nil, err
	}
	return ep, nil
}

// openRawQP makes the side's raw QP on dev and connects it to one the
// master makes for it.
func (s *liteSide) openRawQP(ctx context.Context, dev verbs.Device, master krcore.NodeID, timeout time.Duration) error {
	ep, err := rawqp.NewEndpoint(dev, nil, vqrun.MaxMessage, rawqp.Shape{SendDepth: rawDepth, RecvDepth: rawDepth})
	if err != nil {
		return err
	}
	s.raw = ep
	resp := make([]byte, lite.MaxRPC)
	k, err := s.node.Call(ctx, master, liteRPCRawQP, []byte(ep.QP.Endpoint().String()), resp)
	if err != nil {
		return err
	}
	peer, err := verbs.ParseEndpoint(string(resp[:k]))
	if err != nil {
		return fmt.Errorf("the master's raw QP: %w", err)
	}
	if err := ep.Connect(peer); err != nil {
		return err
	}
	if err := ep.PostRecvs(rawDepth); err != nil { // before the first SEND, hence before any echo
		return err
	}
	s.rawPoll = rawqp.NewPoller(ctx, ep.CQ, 0, timeout, false)
	return nil
}

// closeRaw releases the side's raw QP.
func (s *liteSide) closeRaw() {
	if s.rawPoll != nil {
		s.rawPoll.Close()
	}
	if s.raw != nil {
		s.raw.Close()
	}
}
