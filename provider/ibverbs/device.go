//go:build linux && cgo && rdma

package ibverbs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/krcore/krcore/verbs"
)

var _ verbs.Provider = (*Provider)(nil)

// Built reports whether this build carries the libibverbs binding: true
// here, in a build with -tags rdma on Linux with cgo.
const Built = true

// Devices lists the RDMA devices libibverbs sees ("rxe0", "mlx5_0", ...).
func (*Provider) Devices() ([]string, error) { return listDevices() }

// Open opens the device called name ("" opens the first) on the provider's
// port and picks the GID its endpoints carry.
func (p *Provider) Open(ctx context.Context, name string) (verbs.Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("ibverbs: open %q: %w", name, err)
	}
	port := p.Port
	if port == 0 {
		port = 1
	}
	c, dn, err := openDevice(name)
	if err != nil {
		return nil, err
	}
	d := &device{name: dn, ctx: c, portNum: port}
	if err := d.init(p); err != nil {
		closeDevice(c)
		return nil, fmt.Errorf("ibverbs: open %s: %w", dn, err)
	}
	return d, nil
}

// device is an open ibv_context with every object made from it.
//
// Locking: mu is held shared by every call that uses a C object of the
// device (post, poll, modify ...) and exclusively by every call that
// destroys one, so nothing is destroyed under a running call. Objects have
// their own locks for their own state below it.
type device struct {
	name    string
	portNum int

	mu     sync.RWMutex
	ctx    *cContext
	closed bool
	info   devInfo
	gidIdx int

	pds  map[*pd]struct{}
	cqs  map[*cq]struct{}
	qps  map[uint32]*qp // by QP number, for completion routing
	srqs map[*srq]struct{}
}

func (d *device) init(p *Provider) error {
	info, err := queryDevice(d.ctx, d.portNum)
	if err != nil {
		return err
	}
	d.info = info
	idx, gid, err := d.pickGID(p)
	if err != nil {
		return err
	}
	d.gidIdx = idx
	d.info.port.GID, d.info.port.GIDIndex = gid, idx
	d.info.attr.MaxInline = d.maxInline()
	d.pds, d.cqs, d.qps, d.srqs = map[*pd]struct{}{}, map[*cq]struct{}{}, map[uint32]*qp{}, map[*srq]struct{}{}
	return nil
}

// pickGID chooses the GID table entry endpoints carry (see the package
// doc): an explicit index, else a RoCE v2 IPv4-mapped GID, else any RoCE v2
// GID, else the first non-zero one. InfiniBand ports route by LID and use
// GID 0.
func (d *device) pickGID(p *Provider) (int, verbs.GID, error) {
	want := -1
	if p.FixedGID {
		want = p.GIDIndex
	}
	if s := os.Getenv("KRCORE_IBV_GID_INDEX"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return 0, verbs.GID{}, fmt.Errorf("KRCORE_IBV_GID_INDEX=%q is not a GID index: %w", s, verbs.ErrInvalid)
		}
		want = n
	}
	if want >= 0 {
		g, _, ok := queryGID(d.ctx, d.portNum, want)
		if !ok {
			return 0, g, fmt.Errorf("GID index %d on port %d is empty: %w", want, d.portNum, verbs.ErrInvalid)
		}
		return want, g, nil
	}
	best, bestRank := -1, 0
	var bestGID verbs.GID
	// Real RoCE tables are a handful of entries; the scan stops early
	// because entries are filled from the bottom.
	empty := 0
	for i := 0; i < d.info.gidTableSize && empty < 16; i++ {
		g, typ, ok := queryGID(d.ctx, d.portNum, i)
		if !ok {
			empty++
			continue
		}
		empty = 0
		rank := 1
		if typ == gidTypeRoCEv2 {
			rank = 2
			if isIPv4Mapped(g) {
				rank = 3
			}
		}
		if !d.info.ethernet && typ == gidTypeIB {
			rank = 3 // IB: the port GID (index 0) is the one to use
		}
		if rank > bestRank {
			best, bestRank, bestGID = i, rank, g
		}
		if rank == 3 {
			break
		}
	}
	if best < 0 {
		if d.info.ethernet {
			return 0, bestGID, fmt.Errorf("port %d has no usable GID (is the netdev up with an address?): %w", d.portNum, verbs.ErrUnreachable)
		}
		return 0, bestGID, nil
	}
	return best, bestGID, nil
}

func isIPv4Mapped(g verbs.GID) bool {
	for _, b := range g[:10] {
		if b != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}

// inlineCache remembers each device's inline limit, which libibverbs
// reports only through a created QP, so probing happens once per process.
var inlineCache sync.Map // device name -> int

// maxInline finds the largest inline size the device grants an RC QP.
func (d *device) maxInline() int {
	if v, ok := inlineCache.Load(d.name); ok {
		return v.(int)
	}
	best := 0
	p, err := allocPD(d.ctx)
	if err != nil {
		return 0
	}
	defer deallocPD(p)
	cq, ch, _, _, err := createCQ(d.ctx, 4)
	if err != nil {
		return 0
	}
	defer destroyCQ(cq, ch)
	for _, n := range []int{1024, 512, 256, 128, 64, 32} {
		q, _, got, err := createQP(p, qptRC, cq, cq, nil, qpCaps{sendWR: 1, recvWR: 1, sendSGE: 1, recvSGE: 1, inline: n}, false)
		if err != nil {
			continue
		}
		destroyQP(q)
		best = max(n, got.inline)
		break
	}
	inlineCache.Store(d.name, best)
	return best
}

// Name is the libibverbs device name.
func (d *device) Name() string { return d.name }

// Attr reports the device's limits as queried at Open.
func (d *device) Attr() verbs.DeviceAttr { return d.info.attr }

// Port reports the port's attributes as queried at Open and the chosen GID.
func (d *device) Port() verbs.PortAttr { return d.info.port }

// use takes the device's shared lock for a call on one of its objects and
// fails once the device is closed. The caller must call d.mu.RUnlock.
func (d *device) use(what string) error {
	d.mu.RLock()
	if d.closed {
		d.mu.RUnlock()
		return fmt.Errorf("ibverbs: %s on closed device %s: %w", what, d.name, verbs.ErrClosed)
	}
	return nil
}

// own takes the device's exclusive lock for creating or destroying an
// object. The caller must call d.mu.Unlock.
func (d *device) own(what string) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("ibverbs: %s on closed device %s: %w", what, d.name, verbs.ErrClosed)
	}
	return nil
}

// AllocPD allocates a protection domain.
func (d *device) AllocPD() (verbs.PD, error) {
	if err := d.own("AllocPD"); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	c, err := allocPD(d.ctx)
	if err != nil {
		return nil, err
	}
	p := &pd{d: d, c: c, mrs: map[*mr]struct{}{}, ahs: map[*ah]struct{}{}}
	d.pds[p] = struct{}{}
	return p, nil
}

// Close destroys every object made from the device, children first, then
// closes the context. Waiters on its CQs return ErrClosed.
func (d *device) Close() error {
	// Wake CQ waiters before taking the lock: they sleep on the netpoller
	// without holding it, but a closed file is what ends their sleep.
	d.mu.RLock()
	closed := d.closed
	cqs := make([]*cq, 0, len(d.cqs))
	for c := range d.cqs {
		cqs = append(cqs, c)
	}
	d.mu.RUnlock()
	if closed {
		return fmt.Errorf("ibverbs: close device %s: %w", d.name, verbs.ErrClosed)
	}
	for _, c := range cqs {
		c.wakeClosed()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("ibverbs: close device %s: %w", d.name, verbs.ErrClosed)
	}
	d.closed = true
	var errs []error
	for _, q := range d.qps {
		errs = append(errs, q.destroyLocked())
	}
	for s := range d.srqs {
		errs = append(errs, s.destroyLocked())
	}
	for p := range d.pds {
		for m := range p.mrs {
			errs = append(errs, m.destroyLocked())
		}
		for a := range p.ahs {
			errs = append(errs, a.destroyLocked())
		}
	}
	for c := range d.cqs {
		errs = append(errs, c.destroyLocked())
	}
	for p := range d.pds {
		errs = append(errs, p.destroyLocked())
	}
	errs = append(errs, closeDevice(d.ctx))
	d.ctx = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ibverbs: close device %s: %w", d.name, err)
	}
	return nil
}

// pd is a protection domain and the objects that pin it.
type pd struct {
	d      *device
	c      *cPD
	closed bool
	mrs    map[*mr]struct{}
	ahs    map[*ah]struct{}
	nqp    int // QPs and SRQs made from it
}

// Close deallocates the PD; it fails with ErrBusy while anything made from
// it is open (libibverbs would answer EBUSY, but later and less clearly).
func (p *pd) Close() error {
	if err := p.d.own("close PD"); err != nil {
		return err
	}
	defer p.d.mu.Unlock()
	if p.closed {
		return fmt.Errorf("ibverbs: close PD: %w", verbs.ErrClosed)
	}
	if n := len(p.mrs) + len(p.ahs) + p.nqp; n > 0 {
		return fmt.Errorf("ibverbs: close PD with %d MRs, %d AHs and %d QPs/SRQs open: %w", len(p.mrs), len(p.ahs), p.nqp, verbs.ErrBusy)
	}
	delete(p.d.pds, p)
	return p.destroyLocked()
}

func (p *pd) destroyLocked() error {
	if p.closed {
		return nil
	}
	p.closed = true
	return deallocPD(p.c)
}

// live checks, under the device lock, that the PD may be used.
func (p *pd) live(what string) error {
	if p.closed {
		return fmt.Errorf("ibverbs: %s on closed PD: %w", what, verbs.ErrClosed)
	}
	return nil
}
