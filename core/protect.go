package core

import (
	"fmt"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/verbs"
)

// limits are the checks' parameters, from the device.
type limits struct {
	maxMsg uint64
}

// refusal is why a request was refused: the completion status and a
// message for logs and counters.
type refusal struct {
	status verbs.Status
	why    string
}

func (r *refusal) Error() string {
	return fmt.Sprintf("%s: %s (%s)", krcore.ErrRefused, r.why, r.status)
}

func (r *refusal) Unwrap() []error { return []error{krcore.ErrRefused, r.status} }

// check is the protection every request passes before it may touch a shared
// QP: the opcode must be valid and make sense for how the VQ is connected,
// the local range must lie inside the caller's own MR with the access the
// operation needs, the remote range inside g (the runtime's record of the
// region the request names; nil for none) with its access, and sizes and
// alignment must hold. It reads nothing of the caller's Region. It is pure:
// the decision depends only on its arguments.
func check(r *krcore.Request, m *MR, g *grant, twoSided bool, lim limits) *refusal {
	refuse := func(st verbs.Status, format string, a ...any) *refusal {
		return &refusal{status: st, why: fmt.Sprintf(format, a...)}
	}
	if !r.Op.Valid() {
		return refuse(verbs.LocQPOpErr, "unknown opcode %d", r.Op)
	}
	if ref := checkLocal(r, m, lim); ref != nil {
		return ref
	}
	if r.Op.IsSend() {
		if !twoSided {
			return refuse(verbs.LocQPOpErr, "%s on a VQ connected without a port", r.Op)
		}
		return nil
	}
	if r.Op == verbs.OpWriteImm && !twoSided {
		return refuse(verbs.LocQPOpErr, "%s on a VQ connected without a port: its notification has no port to reach", r.Op)
	}
	return checkRemote(r, g)
}

// plain reports whether r is a request that checkOwner and check both
// let through, decided in one pass without their calls: a local range
// inside m, a live MR of the runtime (rt), and then a SEND on a VQ
// connected to a port (twoSided), or a READ (into an MR with LOCAL_WRITE)
// or WRITE whose remote range lies inside g, a region rt learned from
// node, with the remote access the operation needs. Anything else, false:
// the full checks decide (FuzzCheck holds plain to them). It is pure,
// like check.
func plain(r *krcore.Request, m *MR, g *grant, rt *Runtime, node krcore.NodeID, twoSided bool, lim limits) bool {
	if !inside(&r.Local, m, lim) {
		return false
	}
	if op := r.Op; op != verbs.OpRead && op != verbs.OpWrite {
		return twoSided && op.IsSend()
	}
	if n, off := uint64(r.Local.Len), r.Remote.Off; g == nil || off > g.len || n > g.len-off || g.rt != rt || g.node != node {
		return false
	}
	if r.Op == verbs.OpRead {
		return m.access&verbs.AccessLocalWrite != 0 && g.access&verbs.AccessRemoteRead != 0
	}
	return g.access&verbs.AccessRemoteWrite != 0
}

// plainKey is what plain let through last on a queue's connection: the
// MR handle and opcode of a READ, WRITE or SEND, and the grant its Region
// held (not the Region: the value a handle points at may be overwritten
// with another). What plain decided from the grant and the connection
// alone (whose runtime the grant is, its node and access, a SEND's port)
// holds for every request that names the same on that connection, since
// none of it changes: the ranges and the MR (its life, its runtime, a
// READ's LOCAL_WRITE: an MR handle's value may be overwritten too) are
// left to check (see Queue.quick). Connect forgets it.
type plainKey struct {
	m  *MR
	g  *grant
	op verbs.Opcode
}

// quick is plain for a request that names q's last plain key: it checks
// the ranges and the MR's life, and returns the MR and grant, and true; or
// false, and plain decides from scratch. q.mu held.
func (q *Queue) quick(r *krcore.Request) (*MR, *grant, bool) {
	k := &q.last
	// ownMR and the READ's LOCAL_WRITE again, as plain's: the MR a handle
	// points at may have been overwritten with another's value since.
	m := q.rt.ownMR(r.Local.MR)
	if m != k.m || grantOf(r.Remote.Region) != k.g || r.Op != k.op || !inside(&r.Local, m, q.rt.lim) {
		return nil, nil, false
	}
	if r.Op.IsSend() {
		return m, k.g, true
	}
	if r.Op == verbs.OpRead && m.access&verbs.AccessLocalWrite == 0 {
		return nil, nil, false
	}
	n, off := uint64(r.Local.Len), r.Remote.Off
	return m, k.g, off <= k.g.len && n <= k.g.len-off
}

// inside reports whether l is a non-empty range inside m, a live MR of
// the runtime, within the message limit: every request's local case,
// decided without the refusals' formatting (plain, checkLocal).
func inside(l *krcore.Local, m *MR, lim limits) bool {
	return l.Len > 0 && l.Off >= 0 && uint64(l.Len) <= lim.maxMsg && m != nil && l.Off <= m.n && l.Len <= m.n-l.Off && m.live()
}

// checkLocal checks the request's local buffer.
func checkLocal(r *krcore.Request, m *MR, lim limits) *refusal {
	// Every request's case first (inside), for an operation that reads
	// the range, or a READ into an MR with LOCAL_WRITE. Whatever else,
	// localRefusal decides, the same checks in full.
	if inside(&r.Local, m, lim) {
		switch r.Op {
		case verbs.OpSend, verbs.OpSendImm, verbs.OpWrite, verbs.OpWriteImm:
			return nil
		case verbs.OpRead:
			if m.access&verbs.AccessLocalWrite != 0 {
				return nil
			}
		}
	}
	return localRefusal(r, m, lim)
}

// localRefusal is checkLocal in full: nil or why the local buffer is
// refused.
func localRefusal(r *krcore.Request, m *MR, lim limits) *refusal {
	l := &r.Local
	n := uint64(l.Len)
	switch {
	case l.Len < 0 || l.Off < 0:
		return &refusal{verbs.LocLenErr, fmt.Sprintf("negative local range off %d len %d", l.Off, l.Len)}
	case n > lim.maxMsg:
		return &refusal{verbs.LocLenErr, fmt.Sprintf("%d bytes exceed the %d-byte message limit", n, lim.maxMsg)}
	case n == 0 && (r.Op == verbs.OpRead || r.Op.IsAtomic()):
		return &refusal{verbs.LocLenErr, fmt.Sprintf("%s needs a local buffer", r.Op)}
	case n == 0:
		return nil
	case m == nil:
		return &refusal{verbs.LocProtErr, "no local MR of this runtime"}
	case !m.live():
		return &refusal{verbs.LocProtErr, "local MR deregistered"}
	case !l.Fits(m.Len()):
		return &refusal{verbs.LocProtErr, fmt.Sprintf("local range [%d,+%d) outside the %d-byte MR", l.Off, n, m.Len())}
	}
	writes := r.Op == verbs.OpRead || r.Op.IsAtomic()
	if writes && m.access&verbs.AccessLocalWrite == 0 {
		return &refusal{verbs.LocProtErr, fmt.Sprintf("%s lands in an MR without LOCAL_WRITE", r.Op)}
	}
	if r.Op.IsAtomic() && n != 8 {
		return &refusal{verbs.LocLenErr, fmt.Sprintf("atomic on %d bytes, want 8", n)}
	}
	return nil
}

// checkRemote checks a one-sided request's remote range against g, the
// record of its region.
func checkRemote(r *krcore.Request, g *grant) *refusal {
	// A READ or WRITE inside the region with its access, decided without
	// the refusals' formatting; whatever else, remoteRefusal decides.
	if g != nil && (r.Op == verbs.OpRead || r.Op == verbs.OpWrite || r.Op == verbs.OpWriteImm) {
		n, off := uint64(r.Local.Len), r.Remote.Off
		need := verbs.AccessRemoteWrite
		if r.Op == verbs.OpRead {
			need = verbs.AccessRemoteRead
		}
		if off <= g.len && n <= g.len-off && g.access&need == need {
			return nil
		}
	}
	return remoteRefusal(r, g)
}

// remoteRefusal is checkRemote in full.
func remoteRefusal(r *krcore.Request, g *grant) *refusal {
	if g == nil {
		return &refusal{verbs.RemInvReqErr, fmt.Sprintf("%s without a remote region", r.Op)}
	}
	n := uint64(r.Local.Len)
	if r.Op.IsAtomic() {
		n = 8
	}
	off := r.Remote.Off
	if off > g.len || n > g.len-off {
		return &refusal{verbs.RemAccessErr, fmt.Sprintf("remote range [%d,+%d) outside region %q of %d bytes", off, n, g.name, g.len)}
	}
	var need verbs.Access
	switch {
	case r.Op == verbs.OpRead:
		need = verbs.AccessRemoteRead
	case r.Op.IsAtomic():
		need = verbs.AccessRemoteAtomic
		if (g.addr+off)%8 != 0 {
			return &refusal{verbs.RemInvReqErr, fmt.Sprintf("atomic at misaligned remote offset %d", off)}
		}
	default:
		need = verbs.AccessRemoteWrite
	}
	if g.access&need != need {
		return &refusal{verbs.RemAccessErr, fmt.Sprintf("%s on region %q granted only %s", r.Op, g.name, g.access)}
	}
	return nil
}
