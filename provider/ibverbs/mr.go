//go:build linux && cgo && rdma

package ibverbs

import (
	"errors"
	"fmt"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// mr is a registered memory region over off-heap memory.
type mr struct {
	p      *pd
	c      *cMR
	buf    []byte
	addr   uint64
	lkey   uint32
	rkey   uint32
	access verbs.Access
	unpin  func()
	closed bool
}

// RegMR registers buf, which must lie in one live offheap block: the NIC
// writes it behind the Go runtime's back, so Go heap memory (which moves
// and is collected) is refused. The block is pinned until the MR closes.
func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if err := p.d.own("RegMR"); err != nil {
		return nil, err
	}
	defer p.d.mu.Unlock()
	if err := p.live("RegMR"); err != nil {
		return nil, err
	}
	if access&^verbs.AccessAll != 0 {
		return nil, fmt.Errorf("ibverbs: RegMR: unknown access bits %s: %w", access, verbs.ErrInvalid)
	}
	// ibv_reg_mr's rule, checked here so every device reports it alike.
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("ibverbs: RegMR with %s: remote write and atomic need LOCAL_WRITE: %w", access, verbs.ErrInvalid)
	}
	if len(buf) == 0 {
		return nil, fmt.Errorf("ibverbs: RegMR of an empty buffer: %w", verbs.ErrInvalid)
	}
	unpin, err := offheap.Pin(buf)
	if err != nil {
		return nil, fmt.Errorf("ibverbs: RegMR of %d bytes: %w (%w)", len(buf), verbs.ErrInvalid, err)
	}
	addr := offheap.Addr(buf)
	// The access bits are numbered as ibv_access_flags.
	c, lkey, rkey, err := regMR(p.c, addr, len(buf), access)
	if err != nil {
		unpin()
		if errors.Is(err, verbs.ErrLimit) {
			// ENOMEM from ibv_reg_mr is nearly always the locked-memory limit.
			return nil, fmt.Errorf("%w (registering %d bytes pins them: check ulimit -l / RLIMIT_MEMLOCK)", err, len(buf))
		}
		return nil, err
	}
	m := &mr{p: p, c: c, buf: buf, addr: addr, lkey: lkey, rkey: rkey, access: access, unpin: unpin}
	p.mrs[m] = struct{}{}
	return m, nil
}

// LKey is the local key.
func (m *mr) LKey() uint32 { return m.lkey }

// RKey is the remote key.
func (m *mr) RKey() uint32 { return m.rkey }

// Addr is the virtual address of the first byte.
func (m *mr) Addr() uint64 { return m.addr }

// Len is the region's length.
func (m *mr) Len() int { return len(m.buf) }

// Bytes is the registered memory.
func (m *mr) Bytes() []byte { return m.buf }

// Access is the region's access flags.
func (m *mr) Access() verbs.Access { return m.access }

// Close deregisters the region and unpins its block.
func (m *mr) Close() error {
	if err := m.p.d.own("close MR"); err != nil {
		return err
	}
	defer m.p.d.mu.Unlock()
	if m.closed {
		return fmt.Errorf("ibverbs: close MR: %w", verbs.ErrClosed)
	}
	delete(m.p.mrs, m)
	return m.destroyLocked()
}

func (m *mr) destroyLocked() error {
	if m.closed {
		return nil
	}
	m.closed = true
	err := deregMR(m.c)
	m.unpin()
	return err
}

// ah is an address handle.
type ah struct {
	p      *pd
	c      *cAH
	dest   verbs.Endpoint
	closed bool
}

// CreateAH creates an address handle for the port named by attr.Dest: its
// GID on RoCE (the GRH is mandatory there), its LID on InfiniBand.
func (p *pd) CreateAH(attr verbs.AHAttr) (verbs.AH, error) {
	if err := p.d.own("CreateAH"); err != nil {
		return nil, err
	}
	defer p.d.mu.Unlock()
	if err := p.live("CreateAH"); err != nil {
		return nil, err
	}
	global, err := p.d.needGRH(attr.Dest)
	if err != nil {
		return nil, fmt.Errorf("ibverbs: CreateAH: %w", err)
	}
	c, err := createAH(p.c, p.d.portNum, global, attr.Dest.GID, p.d.gidIdx, attr.Dest.LID)
	if err != nil {
		return nil, err
	}
	a := &ah{p: p, c: c, dest: verbs.Endpoint{GID: attr.Dest.GID, LID: attr.Dest.LID, Addr: attr.Dest.Addr}}
	p.ahs[a] = struct{}{}
	return a, nil
}

// needGRH reports whether reaching dest needs a global route header, and
// fails when dest names no address this port can use.
func (d *device) needGRH(dest verbs.Endpoint) (bool, error) {
	if d.info.ethernet {
		if dest.GID == (verbs.GID{}) {
			return false, fmt.Errorf("destination has no GID, which RoCE needs: %w", verbs.ErrInvalid)
		}
		return true, nil
	}
	if dest.LID == 0 && dest.GID == (verbs.GID{}) {
		return false, fmt.Errorf("destination has neither LID nor GID: %w", verbs.ErrInvalid)
	}
	return dest.LID == 0, nil
}

// Dest is the port the handle names.
func (a *ah) Dest() verbs.Endpoint { return a.dest }

// Close destroys the handle.
func (a *ah) Close() error {
	if err := a.p.d.own("close AH"); err != nil {
		return err
	}
	defer a.p.d.mu.Unlock()
	if a.closed {
		return fmt.Errorf("ibverbs: close AH: %w", verbs.ErrClosed)
	}
	delete(a.p.ahs, a)
	return a.destroyLocked()
}

func (a *ah) destroyLocked() error {
	if a.closed {
		return nil
	}
	a.closed = true
	return destroyAH(a.c)
}
