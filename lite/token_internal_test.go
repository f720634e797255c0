package lite

import (
	"context"
	"hash/fnv"
	"testing"
	"time"
)

// TestReplyTokenNotFromName: a session's reply token, which a reply's tag
// is made from (replyTag), is not a hash of the reply area's export name,
// which is no secret (krcored lists every client's exports to any client
// that asks for its status); the callee's ring holds the caller's token.
func TestReplyTokenNotFromName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := newRPCRig(ctx, t)
	caller, callee, svc := r.caller, r.callee, r.svc
	go func() {
		if call, err := svc.Recv(ctx); err == nil {
			svc.Reply(ctx, call, []byte("answer"))
		}
	}()
	resp := make([]byte, 16)
	if k, err := caller.Call(ctx, 2, 1, []byte("question"), resp); err != nil || string(resp[:k]) != "answer" {
		t.Fatalf("Call: %q, %v", resp[:max(k, 0)], err)
	}
	caller.rpc.mu.Lock()
	s := caller.rpc.sessions[2]
	caller.rpc.mu.Unlock()
	callee.rpc.mu.Lock()
	g := callee.rpc.rings[1]
	callee.rpc.mu.Unlock()
	if s == nil || g == nil {
		t.Fatalf("session %v, ring %v after a call", s, g)
	}
	h := fnv.New64a()
	h.Write([]byte(s.replyAs))
	if s.token == h.Sum64() {
		t.Fatal("the reply token is the FNV hash of the reply area's export name: anyone who learns the name can make a reply's tag")
	}
	if g.token != s.token || g.replyAs != s.replyAs {
		t.Fatalf("the callee's ring has token %#x for %q, the caller's session %#x for %q", g.token, g.replyAs, s.token, s.replyAs)
	}
}
