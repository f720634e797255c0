package lite

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/krcore/krcore"
)

// Control message kinds and reply codes of barriers (the sync range,
// 0x20-0x2f).
const (
	opBarrier      byte = 0x20 + iota // arrive: count(4) token(8) name
	opBarrierLeave                    // withdraw an arrival: same body
)

const (
	codeReleased byte = 0x20 + iota // a leave found the arrival released
	codeClosed                      // the master's Node closed
)

const (
	barrierHdr = 12
	// leaveTimeout bounds the withdrawal a cancelled Barrier sends its
	// master, beyond the caller's context: it learns whether its arrival
	// was counted.
	leaveTimeout = time.Second
	// closeNotice bounds the time a master's Close spends telling the
	// participants waiting on it.
	closeNotice = time.Second
)

// barrier is one generation of a barrier mastered here: the arrivals
// waiting for count of them. A barrier lives in its master's Node, as
// LITE's does: an arrival is one control request, and the master answers
// every one when the last arrives, so a waiting participant polls nothing
// (a lock's waiters poll because its hand-off must not need the master's
// CPU; a barrier's release is one event for all).
type barrier struct {
	count int
	in    []arrival
}

// arrival is a participant waiting at a barrier, and where its reply goes.
type arrival struct {
	node  krcore.NodeID
	port  uint32
	id    uint64 // of its request
	token uint64 // names it in a leave
}

// Barrier waits, within ctx, until count participants (this call among
// them) reached the barrier called name at master, and returns with them.
// The barrier is reusable: once count arrived, the next arrivals make the
// next generation. Every participant must give the same count, or is
// refused (ErrInvalid). A participant that gives up (ctx) withdraws its
// arrival and returns ctx's error, unless the generation completed
// meanwhile: then it was counted, and Barrier returns nil. A participant
// whose Node closes after arriving stays counted; one that never arrives
// holds the others until their contexts end.
func (n *Node) Barrier(ctx context.Context, master krcore.NodeID, name string, count int) error {
	if name == "" || len(name) > slotSize-hdrLen-barrierHdr || count < 1 || count > 1<<20 {
		return fmt.Errorf("lite: barrier %q of %d: %w", name, count, krcore.ErrInvalid)
	}
	n.mu.Lock()
	n.seq++
	token := n.seq
	n.mu.Unlock()
	b := make([]byte, barrierHdr, barrierHdr+len(name))
	binary.LittleEndian.PutUint32(b, uint32(count))
	binary.LittleEndian.PutUint64(b[4:], token)
	body := string(append(b, name...))
	r, err := n.request(ctx, master, ctlMsg{kind: opBarrier, name: body})
	switch {
	case err == nil:
		err = barrierErr(r)
	case ctx.Err() != nil:
		if n.leave(ctx, master, body) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("lite: barrier %q at node %d: %w", name, master, err)
	}
	return nil
}

// leave withdraws an arrival whose caller gave up, and reports whether it
// had been released already.
func (n *Node) leave(ctx context.Context, master krcore.NodeID, body string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	defer cancel()
	r, err := n.request(ctx, master, ctlMsg{kind: opBarrierLeave, name: body})
	return err == nil && r.code == codeReleased
}

// barrierErr is the error a barrier's reply stands for.
func barrierErr(r reply) error {
	if r.code == codeClosed {
		return fmt.Errorf("the master closed: %w", krcore.ErrClosed)
	}
	return replyErr(r)
}

// barrierMsg answers an arrival or a leave at the barrier's master. The
// replies go out from a goroutine of the Node: serve never waits on a
// participant.
func (n *Node) barrierMsg(from krcore.NodeID, req ctlMsg) {
	if len(req.name) <= barrierHdr {
		return
	}
	count := int(binary.LittleEndian.Uint32([]byte(req.name)))
	a := arrival{node: from, port: req.port, id: req.id, token: binary.LittleEndian.Uint64([]byte(req.name[4:]))}
	name := req.name[barrierHdr:]
	s := &n.sync
	s.bmu.Lock()
	defer s.bmu.Unlock()
	if s.barriers == nil {
		s.barriers = map[string]*barrier{}
	}
	b := s.barriers[name]
	var out []arrival
	r := reply{code: codeOK}
	switch {
	case req.kind == opBarrierLeave:
		out = []arrival{a}
		if b == nil || !b.withdraw(a) {
			r.code = codeReleased
		}
	case b != nil && b.count != count:
		out, r = []arrival{a}, failure(codeInvalid, "%d participants; the barrier waits for %s", count, strconv.Itoa(b.count))
	case b == nil:
		b = &barrier{count: count}
		s.barriers[name] = b
		fallthrough
	default:
		b.in = append(b.in, a)
		if len(b.in) == b.count {
			out = b.in
			delete(s.barriers, name) // the next arrival starts the next generation
		}
	}
	if b != nil && len(b.in) == 0 {
		delete(s.barriers, name)
	}
	if len(out) > 0 {
		s.spawn(func(ctx context.Context) { n.answer(ctx, out, r) })
	}
}

// withdraw removes a's arrival, if it waits here.
func (b *barrier) withdraw(a arrival) bool {
	for i, w := range b.in {
		if w.node == a.node && w.token == a.token {
			b.in = append(b.in[:i], b.in[i+1:]...)
			return true
		}
	}
	return false
}

// answer sends r to each arrival, each reply bounded by ctlTimeout. It
// runs to the end even while the Node closes: a generation released is
// told.
func (n *Node) answer(ctx context.Context, to []arrival, r reply) {
	for _, a := range to {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ctlTimeout)
		// A lost reply fails the participant at its deadline.
		_ = n.send(actx, a.node, a.port, ctlMsg{kind: opReply, id: a.id, code: r.code, name: r.name})
		cancel()
	}
}

// closeBarriers tells the participants waiting at barriers mastered here
// that the master closed; part of Close, after serve stopped.
func (n *Node) closeBarriers() {
	s := &n.sync
	s.bmu.Lock()
	var out []arrival
	for _, b := range s.barriers {
		out = append(out, b.in...)
	}
	s.barriers = nil
	s.bmu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeNotice)
	defer cancel()
	for _, a := range out {
		_ = n.send(ctx, a.node, a.port, ctlMsg{kind: opReply, id: a.id, code: codeClosed})
	}
}

// stopSync is Close's part for atomics, locks and barriers.
func (n *Node) stopSync() {
	n.closeBarriers()
	n.sync.stop(n.api)
}
