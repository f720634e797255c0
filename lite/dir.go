package lite

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/krcore/krcore"
)

// Control op kinds of the directory (this file's range: 0x44-0x47).
const (
	opDirAdd byte = 0x44 + iota
	opDirDel
	opDirFind
)

// The directory is LITE's cluster manager reduced to what finding an LMR
// needs: the Node at Options.Directory keeps name -> master for the LMRs
// of every Node that names it. Malloc lists a name there (first come: a
// name another master listed is ErrBusy), Free withdraws it, and MapName
// and Master look it up. An entry lives as long as its LMR or the
// directory's Node; a master that dies without Free leaves its names
// behind, and a Map of them fails at the master.

// directory is the node keeping this Node's names.
func (n *Node) directory() krcore.NodeID {
	if n.dirNode != 0 {
		return n.dirNode
	}
	return n.api.Node()
}

// dirCall asks the directory, itself if this Node is the directory.
func (n *Node) dirCall(ctx context.Context, kind byte, name string) (reply, error) {
	if d := n.directory(); d != n.api.Node() {
		return n.request(ctx, d, ctlMsg{kind: kind, name: name})
	}
	return n.dirAnswer(n.api.Node(), kind, name), nil
}

// dirAnswer answers a directory request from node.
func (n *Node) dirAnswer(from krcore.NodeID, kind byte, name string) reply {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.names == nil {
		n.names = map[string]krcore.NodeID{}
	}
	master, ok := n.names[name]
	switch {
	case name == "" || len(name) > maxName:
		return reply{code: codeInvalid}
	case kind == opDirAdd && ok && master != from:
		return failure(codeBusy, "%q is listed by node %d", name, master)
	case kind == opDirAdd:
		n.names[name] = from
	case kind == opDirDel && ok && master == from:
		delete(n.names, name)
	case kind == opDirDel, !ok:
		return reply{code: codeFreed}
	default: // opDirFind
		return reply{name: string(binary.LittleEndian.AppendUint64(nil, master))}
	}
	return reply{}
}

// enlist lists l at the directory.
func (n *Node) enlist(ctx context.Context, l *LMR) error {
	r, err := n.dirCall(ctx, opDirAdd, l.name)
	if err == nil {
		err = replyErr(r)
	}
	if err != nil {
		return fmt.Errorf("list at directory node %d: %w", n.directory(), err)
	}
	n.mu.Lock()
	l.inDir = true
	n.mu.Unlock()
	return nil
}

// unlist withdraws l's name from the directory, if enlist listed it.
func (n *Node) unlist(l *LMR) error {
	n.mu.Lock()
	listed := l.inDir
	l.inDir = false
	n.mu.Unlock()
	if !listed {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout)
	defer cancel()
	var err error
	if d := n.directory(); d != n.api.Node() && n.isClosed() {
		// Closing: tell the directory without waiting for its answer, so
		// that a directory gone (unanswered withdrawals) costs Close a SEND
		// per LMR, not a timeout.
		err = n.send(ctx, d, n.port, ctlMsg{kind: opDirDel, port: n.port, name: l.name})
	} else {
		var r reply
		r, err = n.dirCall(ctx, opDirDel, l.name)
		if err == nil && r.code != codeFreed { // not listed (any more): nothing to do
			err = replyErr(r)
		}
	}
	if err != nil {
		return fmt.Errorf("withdraw from directory node %d: %w", n.directory(), err)
	}
	return nil
}

// Master is the master of the LMR called name, as the directory knows it;
// a name nobody lists is ErrFreed.
func (n *Node) Master(ctx context.Context, name string) (krcore.NodeID, error) {
	if name == "" || len(name) > maxName {
		return 0, fmt.Errorf("lite: find %q: %w", name, krcore.ErrInvalid)
	}
	r, err := n.dirCall(ctx, opDirFind, name)
	if err == nil {
		err = replyErr(r)
	}
	if err == nil && len(r.name) != 8 {
		err = fmt.Errorf("answer of %d bytes: %w", len(r.name), krcore.ErrInvalid)
	}
	if err != nil {
		return 0, fmt.Errorf("lite: find %q at directory node %d: %w", name, n.directory(), err)
	}
	return binary.LittleEndian.Uint64([]byte(r.name)), nil
}

// MapName maps the LMR called name with perm, wherever its master is: it
// asks the directory for the master, then Maps there.
func (n *Node) MapName(ctx context.Context, name string, perm Perm) (Handle, error) {
	master, err := n.Master(ctx, name)
	if err != nil {
		return Handle{}, err
	}
	return n.Map(ctx, master, name, perm)
}
