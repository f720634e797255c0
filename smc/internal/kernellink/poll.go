package kernellink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/krcore/krcore/smc/internal/smcr"
	"github.com/krcore/krcore/verbs"
)

// poll takes the group's completions until ctx ends or the link fails:
// polling while they come, sleeping on the CQ when none do.
func (g *Group) poll(ctx context.Context) {
	defer close(g.polled)
	wcs := make([]verbs.WC, 32)
	for {
		n, err := g.cq.Poll(wcs)
		if err != nil {
			g.fail(fmt.Errorf("kernellink: polling the link's CQ: %w", err))
			return
		}
		for _, wc := range wcs[:n] {
			if err := g.complete(wc); err != nil {
				g.fail(err)
				return
			}
		}
		if n > 0 {
			continue
		}
		if err := g.cq.Wait(ctx); err != nil {
			if ctx.Err() == nil {
				g.fail(fmt.Errorf("kernellink: waiting on the link's CQ: %w", err))
			}
			return
		}
	}
}

// complete settles one completion: a SEND's frees its slot (and tells
// its connection how far its WRITEs are done), a receive's message is
// handled and its buffer reposted.
func (g *Group) complete(wc verbs.WC) error {
	if wc.Status != verbs.Success {
		return fmt.Errorf("kernellink: the link failed: %v completion with %v: %w", wc.Op, wc.Status, ErrAborted)
	}
	if wc.Op != verbs.WCRecv {
		g.freeSlot(int(wc.ID))
		return nil
	}
	i := int(wc.ID)
	b := g.llc.Bytes()[i*llcBufSize : i*llcBufSize+int(wc.ByteLen)]
	var err error
	if len(b) > 0 && b[0] == smcr.CDCType {
		// Handled in place before the buffer is reposted: a CDC message
		// is applied at once, nothing of it kept.
		err = g.receiveCDC(b)
	} else {
		// An LLC message may be kept (passed on, or an answer waiting
		// for a send slot): a copy.
		b = append([]byte(nil), b...)
	}
	g.recvSGE[0] = verbs.SGEOf(g.llc, i*llcBufSize, llcBufSize)
	g.recvWR[0] = verbs.RecvWR{ID: wc.ID, SGL: g.recvSGE[:]}
	if _, perr := g.qp.PostRecv(g.recvWR[:]); perr != nil {
		return fmt.Errorf("kernellink: reposting a receive: %w", perr)
	}
	if err != nil || len(b) == 0 || b[0] == smcr.CDCType {
		return err
	}
	return g.receiveLLC(b)
}

// freeSlot settles a completed SEND's slot, then sends what waited for
// one.
func (g *Group) freeSlot(slot int) {
	g.mu.Lock()
	u := g.use[slot]
	g.use[slot] = slotUse{}
	var next []byte
	if len(g.pending) > 0 {
		next, g.pending = g.pending[0], g.pending[1:]
	}
	g.mu.Unlock()
	if u.done != nil {
		close(u.done)
	}
	if u.conn != nil {
		u.conn.sent(u.fin)
	}
	if next != nil {
		g.post(slot, next, slotUse{}, nil)
		return
	}
	g.slotFree <- slot
}

// receiveCDC passes a CDC message to its connection.
func (g *Group) receiveCDC(b []byte) error {
	m, err := smcr.DecodeCDC(b)
	if err != nil {
		return err
	}
	g.mu.Lock()
	c := g.conns[m.Token]
	g.mu.Unlock()
	if c != nil {
		c.onCDC(m)
	}
	return nil
}

// receiveLLC handles an LLC message: the requests a single-link group
// answers are answered here; the rest (CONFIRM_LINK) goes to the
// handshake waiting for it.
func (g *Group) receiveLLC(b []byte) error {
	h, err := smcr.ParseLLCHeader(b)
	if err != nil {
		return err
	}
	if h.Flags&smcr.LLCFlagResp != 0 && h.Type != smcr.LLCConfirmLink {
		return nil // the answer to our DELETE_LINK or TEST_LINK
	}
	switch h.Type {
	case smcr.LLCTestLink, smcr.LLCConfirmRkey, smcr.LLCDeleteRkey:
		// One link: nothing to map or unmap on another, the request
		// echoed as the response says it is done (no negative flag).
		b[3] |= smcr.LLCFlagResp
		g.trySend(b)
	case smcr.LLCAddLink:
		g.ep.addLinksDeclined.Add(1)
		g.trySend(rejectAddLink(b))
	case smcr.LLCDeleteLink:
		return fmt.Errorf("kernellink: the kernel deleted the link: %w", ErrAborted)
	default:
		select {
		case g.llcIn <- b:
		default:
			return fmt.Errorf("kernellink: unexpected LLC type %d", h.Type)
		}
	}
	return nil
}

// rejectAddLink is the kernel client's own answer to an ADD_LINK request
// it cannot serve (smc_llc_cli_add_link_reject): the request sent back
// with the response and reject flags and reason 1 (no alternate path) in
// the header's reason nibble, where a little-endian kernel reads it.
func rejectAddLink(b []byte) []byte {
	b[3] |= smcr.LLCFlagResp | smcr.LLCFlagAddLinkReject
	b[2] = b[2]&0xf0 | 1
	return b
}

// fail ends the group: its connections abort, it leaves the endpoint,
// and its resources go once the poller returned.
func (g *Group) fail(err error) {
	if g.detach(err) {
		go g.end(false) // owned by g: it destroys g and returns
	}
}

// end stops the poller and destroys the group; with bye set (and the
// link confirmed) it first sends DELETE_LINK (orderly, all links) and
// waits at most a second for its completion, so that the kernel ends its
// link group at once instead of finding the QP dead on its next use.
func (g *Group) end(bye bool) {
	g.mu.Lock()
	bye = bye && g.confirmed && g.stop != nil
	g.mu.Unlock()
	if bye {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		del := &smcr.DeleteLink{Version: 2, Flags: smcr.LLCFlagDelLinkAll | smcr.LLCFlagDelLinkOrdly,
			LinkNum: linkNum, Reason: smcr.DelLinkOpInit}
		done := make(chan struct{})
		if g.send(ctx, del.Append(nil), slotUse{done: done}) == nil {
			select {
			case <-done:
			case <-ctx.Done():
			}
		}
		cancel()
	}
	if g.stop != nil {
		g.stop()
		<-g.polled
	}
	g.destroy()
}

// destroy frees what setup and the connections made.
func (g *Group) destroy() error {
	var errs []error
	if g.qp != nil {
		errs = append(errs, g.qp.Close())
	}
	g.mu.Lock()
	mrs, mem := g.mrs, g.mem
	g.mrs, g.mem = nil, nil
	g.mu.Unlock()
	for _, mr := range mrs {
		errs = append(errs, mr.Close())
	}
	if g.cq != nil {
		errs = append(errs, g.cq.Close())
	}
	if g.pd != nil {
		errs = append(errs, g.pd.Close())
	}
	for _, b := range mem {
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}
