package core

import (
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/udrpc"
)

// TestPingSelf: a runtime's control QP answers the runtime itself, which
// is how judge tells that the runtime ran while a peer stayed silent.
func TestPingSelf(t *testing.T) {
	ctx, a, _ := rcPair(t, 20*time.Second)
	if err := a.ctrl.pingSelf(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestJudgeLivePeer: a peer that answers is not dead, however its request
// or call failed.
func TestJudgeLivePeer(t *testing.T) {
	ctx, a, _ := rcPair(t, 20*time.Second)
	p, err := a.peerFor(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.judge(p); err != nil {
		t.Fatalf("a live peer judged dead: %v", err)
	}
}

// TestJudgeSilentPeer: a peer that stopped answering is dead after
// deathRounds pings in which this runtime answered its own, not one.
func TestJudgeSilentPeer(t *testing.T) {
	ctx, a, b := rcPair(t, 20*time.Second)
	p, err := a.peerFor(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	b.dev.Close() // a crash: its record stays, its QPs answer no more
	err = a.judge(p)
	var s *silence
	if !errors.As(err, &s) || !errors.Is(err, udrpc.ErrNoReply) {
		t.Fatalf("a silent peer judged %v, want dead with no reply", err)
	}
	// A starved runtime may fail to answer itself in some rounds (they
	// count for nothing), or in all of them (then the last round decides).
	if s.counted != deathRounds && s.rounds != judgeRounds {
		t.Errorf("judged dead on %d rounds with this node's own answer of %d, want %d", s.counted, s.rounds, deathRounds)
	}
	t.Log(err)
}

// TestJudgeOwnStall: a runtime whose own control path stalls for longer
// than deathRounds rounds, as a process starved of CPU does, does not take
// a live peer for dead: the rounds in which it could not answer itself
// count for nothing. The stall: the control server's queue is held, so
// the goroutine delivering the control QP's completions stops at the
// first request to arrive (the judgement's own ping, sent with the
// peer's), and no reply is delivered until it is released.
func TestJudgeOwnStall(t *testing.T) {
	ctx, a, _ := rcPair(t, 20*time.Second)
	p, err := a.peerFor(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	stall := (deathRounds + 2) * probeTimeout
	a.ctrl.mu.Lock()
	time.AfterFunc(stall, a.ctrl.mu.Unlock)
	t0 := time.Now()
	if err := a.judge(p); err != nil {
		t.Fatalf("a live peer judged dead after this runtime stalled %v: %v", stall, err)
	}
	// Under 'stall' only if the peer's answer came in before the stall
	// took hold: nothing was tested then.
	t.Logf("judged alive in %v, the stall %v", time.Since(t0), stall)
}
