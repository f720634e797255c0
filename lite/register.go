package lite

import (
	"context"
	"fmt"

	"github.com/krcore/krcore"
)

// Register makes mr, memory the caller registered with this Node's API,
// an LMR named name, mastered and held by this Node; allow is the
// permissions it grants to mappers, and mr must have the remote access
// they need (else ErrInvalid). The memory stays the caller's: Free
// withdraws every grant on it but does not deregister it (deregister it
// after Free), and a Move copies the bytes to the new node and withdraws
// mr from the LMR, which then no longer uses it. A name in use is ErrBusy.
func (n *Node) Register(ctx context.Context, name string, mr krcore.MR, allow Perm) (*LMR, error) {
	err := ctx.Err()
	if mr == nil || mr.Len() <= 0 {
		err = krcore.ErrInvalid
	}
	var l *LMR
	if err == nil {
		l, err = n.newLMR(name, allow, single(n.api.Node(), mr.Len()))
	}
	if err != nil {
		return nil, fmt.Errorf("lite: register %q allowing %b: %w", name, allow, err)
	}
	id := n.pieceIDs(1)[0]
	// A trial export checks that mr is this API's and has the access the
	// grants need, which a Map would otherwise find out.
	if err := n.api.Export(id, mr, 0, mr.Len(), allow.access(), n.principal()); err != nil {
		l.drop()
		l.op.Unlock()
		return nil, fmt.Errorf("lite: register %q allowing %b: %w", name, allow, err)
	}
	n.api.Unexport(id)
	n.mu.Lock()
	n.pieces[id] = &holding{master: n.principal(), mr: mr, own: true}
	l.pieces = []string{id}
	n.mu.Unlock()
	if err := n.publish(ctx, l); err != nil {
		return nil, fmt.Errorf("lite: register %q: %w", name, err)
	}
	return l, nil
}
