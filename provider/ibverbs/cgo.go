//go:build linux && cgo && rdma

package ibverbs

// This file is the whole cgo layer: every call into libibverbs goes through
// a small C wrapper here. The wrappers exist because libibverbs' fast-path
// verbs (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq, ibv_query_port,
// ibv_reg_mr) are static inline functions or macros cgo cannot call, and
// because flat structs let Go fill work requests without touching C unions.
// C never receives a Go pointer it keeps: work requests are copied into
// C-allocated arrays owned by the QP, and registered memory is off-heap.

/*
#cgo LDFLAGS: -libverbs
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

// krc_swr is a send work request in a shape Go can fill: the C side turns
// it into an ibv_send_wr (whose unions cgo cannot address).
typedef struct {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	struct ibv_ah *ah;
	uint32_t imm;
	uint32_t rkey;
	uint32_t remote_qpn;
	uint32_t remote_qkey;
	uint32_t opcode;
	uint32_t send_flags;
	uint32_t num_sge;
	uint32_t sge_off;
} krc_swr;

// krc_rwr is a receive work request; its SGEs start at sge_off.
typedef struct {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t sge_off;
} krc_rwr;

// krc_wc is a work completion with the immediate in host order.
typedef struct {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t imm;
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;
	uint32_t vendor_err;
} krc_wc;

// krc_modify carries the ibv_qp_attr fields krcore sets; mask says which.
typedef struct {
	int mask;
	int state;
	int access;
	uint32_t qkey;
	int port;
	int mtu;
	uint32_t dest_qpn;
	uint32_t rq_psn;
	uint32_t sq_psn;
	int min_rnr_timer;
	int timeout;
	int retry_cnt;
	int rnr_retry;
	int max_rd_atomic;
	int max_dest_rd_atomic;
	int is_global;
	uint8_t dgid[16];
	int sgid_index;
	uint16_t dlid;
} krc_modify;

// krc_post_send links n requests into wrs (caller-owned scratch) and posts
// them in one call. *done is how many the device accepted.
static int krc_post_send(struct ibv_qp *qp, const krc_swr *in, struct ibv_sge *sges,
			 struct ibv_send_wr *wrs, int n, int *done) {
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *w = &wrs[i];
		memset(w, 0, sizeof *w);
		w->wr_id = in[i].wr_id;
		w->next = i + 1 < n ? &wrs[i + 1] : NULL;
		w->sg_list = in[i].num_sge ? &sges[in[i].sge_off] : NULL;
		w->num_sge = (int)in[i].num_sge;
		w->opcode = (enum ibv_wr_opcode)in[i].opcode;
		w->send_flags = in[i].send_flags;
		switch (w->opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_RDMA_READ:
			w->wr.rdma.remote_addr = in[i].remote_addr;
			w->wr.rdma.rkey = in[i].rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			w->wr.atomic.remote_addr = in[i].remote_addr;
			w->wr.atomic.rkey = in[i].rkey;
			w->wr.atomic.compare_add = in[i].compare_add;
			w->wr.atomic.swap = in[i].swap;
			break;
		default:
			break;
		}
		if (w->opcode == IBV_WR_SEND_WITH_IMM || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
			w->imm_data = htonl(in[i].imm);
		if (qp->qp_type == IBV_QPT_UD) {
			w->wr.ud.ah = in[i].ah;
			w->wr.ud.remote_qpn = in[i].remote_qpn;
			w->wr.ud.remote_qkey = in[i].remote_qkey;
		}
	}
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(qp, wrs, &bad);
	*done = rc == 0 ? n : (bad ? (int)(bad - wrs) : 0);
	return rc;
}

// krc_post_recv posts n receives to a QP, or to srq when it is not NULL.
static int krc_post_recv(struct ibv_qp *qp, struct ibv_srq *srq, const krc_rwr *in,
			 struct ibv_sge *sges, struct ibv_recv_wr *wrs, int n, int *done) {
	for (int i = 0; i < n; i++) {
		struct ibv_recv_wr *w = &wrs[i];
		w->wr_id = in[i].wr_id;
		w->next = i + 1 < n ? &wrs[i + 1] : NULL;
		w->sg_list = in[i].num_sge ? &sges[in[i].sge_off] : NULL;
		w->num_sge = (int)in[i].num_sge;
	}
	struct ibv_recv_wr *bad = NULL;
	int rc = srq ? ibv_post_srq_recv(srq, wrs, &bad) : ibv_post_recv(qp, wrs, &bad);
	*done = rc == 0 ? n : (bad ? (int)(bad - wrs) : 0);
	return rc;
}

// krc_poll_cq polls up to n completions through tmp into out.
static int krc_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *tmp, krc_wc *out) {
	int k = ibv_poll_cq(cq, n, tmp);
	for (int i = 0; i < k; i++) {
		out[i].wr_id = tmp[i].wr_id;
		out[i].status = tmp[i].status;
		out[i].opcode = tmp[i].opcode;
		out[i].byte_len = tmp[i].byte_len;
		out[i].imm = ntohl(tmp[i].imm_data);
		out[i].qp_num = tmp[i].qp_num;
		out[i].src_qp = tmp[i].src_qp;
		out[i].wc_flags = tmp[i].wc_flags;
		out[i].vendor_err = tmp[i].vendor_err;
	}
	return k;
}

static int krc_req_notify_cq(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

// krc_get_cq_event takes one event from a (non-blocking) completion channel
// and acknowledges it at once, so ibv_destroy_cq never waits for an ack.
// It returns 0 or -errno (-EAGAIN: no event yet).
static int krc_get_cq_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx))
		return -errno;
	ibv_ack_cq_events(cq, 1);
	return 0;
}

static int krc_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *pa) {
	return ibv_query_port(ctx, port, pa);
}

// krc_query_gid reads GID index idx and its type (an ibv_gid_type), or
// returns -errno for an empty or unreadable entry.
static int krc_query_gid(struct ibv_context *ctx, uint8_t port, int idx, uint8_t *gid, int *type) {
	struct ibv_gid_entry e;
	if (ibv_query_gid_ex(ctx, port, idx, &e, 0))
		return errno ? -errno : -EINVAL;
	memcpy(gid, e.gid.raw, 16);
	*type = (int)e.gid_type;
	return 0;
}

static struct ibv_mr *krc_reg_mr(struct ibv_pd *pd, uint64_t addr, size_t len, int access) {
	return ibv_reg_mr(pd, (void *)(uintptr_t)addr, len, access);
}

static struct ibv_qp *krc_create_qp(struct ibv_pd *pd, int type, struct ibv_cq *scq,
				    struct ibv_cq *rcq, struct ibv_srq *srq, struct ibv_qp_cap *cap,
				    int sig_all) {
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.qp_type = (enum ibv_qp_type)type;
	ia.send_cq = scq;
	ia.recv_cq = rcq;
	ia.srq = srq;
	ia.cap = *cap;
	ia.sq_sig_all = sig_all;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (qp)
		*cap = ia.cap;
	return qp;
}

static struct ibv_srq *krc_create_srq(struct ibv_pd *pd, uint32_t max_wr, uint32_t max_sge) {
	struct ibv_srq_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.attr.max_wr = max_wr;
	ia.attr.max_sge = max_sge;
	return ibv_create_srq(pd, &ia);
}

static int krc_modify_qp(struct ibv_qp *qp, const krc_modify *m) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = (enum ibv_qp_state)m->state;
	a.qp_access_flags = m->access;
	a.qkey = m->qkey;
	a.pkey_index = 0;
	a.port_num = (uint8_t)m->port;
	a.path_mtu = (enum ibv_mtu)m->mtu;
	a.dest_qp_num = m->dest_qpn;
	a.rq_psn = m->rq_psn;
	a.sq_psn = m->sq_psn;
	a.min_rnr_timer = (uint8_t)m->min_rnr_timer;
	a.timeout = (uint8_t)m->timeout;
	a.retry_cnt = (uint8_t)m->retry_cnt;
	a.rnr_retry = (uint8_t)m->rnr_retry;
	a.max_rd_atomic = (uint8_t)m->max_rd_atomic;
	a.max_dest_rd_atomic = (uint8_t)m->max_dest_rd_atomic;
	a.ah_attr.port_num = (uint8_t)m->port;
	a.ah_attr.dlid = m->dlid;
	if (m->is_global) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, m->dgid, 16);
		a.ah_attr.grh.sgid_index = (uint8_t)m->sgid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	return ibv_modify_qp(qp, &a, m->mask);
}

// krc_query_qp_state returns the QP's current state or -errno. The device
// moves a QP to ERR on its own (a remote access error), so the state
// libibverbs cached at the last modify is not enough.
static int krc_query_qp_state(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		return errno ? -errno : -EINVAL;
	return (int)a.qp_state;
}

static struct ibv_ah *krc_create_ah(struct ibv_pd *pd, int port, int is_global, const uint8_t *dgid,
				    int sgid_index, uint16_t dlid) {
	struct ibv_ah_attr a;
	memset(&a, 0, sizeof a);
	a.port_num = (uint8_t)port;
	a.dlid = dlid;
	if (is_global) {
		a.is_global = 1;
		memcpy(a.grh.dgid.raw, dgid, 16);
		a.grh.sgid_index = (uint8_t)sgid_index;
		a.grh.hop_limit = 64;
	}
	return ibv_create_ah(pd, &a);
}

static const char *krc_device_name(struct ibv_device **list, int i) {
	return ibv_get_device_name(list[i]);
}

static struct ibv_context *krc_open(struct ibv_device **list, int i) {
	return ibv_open_device(list[i]);
}

static int krc_errno(void) { return errno; }
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/krcore/krcore/verbs"
)

// Sizes of the C scratch arrays: postBatch work requests per cgo call,
// pollBatch completions per ibv_poll_cq.
const (
	postBatch = 32
	pollBatch = 32
)

// Go names for the C types the rest of the package handles.
type (
	cContext = C.struct_ibv_context
	cPD      = C.struct_ibv_pd
	cMR      = C.struct_ibv_mr
	cCQ      = C.struct_ibv_cq
	cChannel = C.struct_ibv_comp_channel
	cQP      = C.struct_ibv_qp
	cSRQ     = C.struct_ibv_srq
	cAH      = C.struct_ibv_ah
	cSWR     = C.krc_swr
	cRWR     = C.krc_rwr
	cSGE     = C.struct_ibv_sge
	cWC      = C.krc_wc
)

// errnoErr turns a C return code into an error wrapping both the errno and
// the verbs sentinel the errno means, naming the call that failed.
func errnoErr(what string, rc C.int) error {
	e := syscall.Errno(rc)
	if rc < 0 {
		e = syscall.Errno(-rc)
	}
	if e == 0 {
		e = syscall.EIO
	}
	var s error
	switch e {
	case syscall.EINVAL:
		s = verbs.ErrInvalid
	case syscall.ENOMEM, syscall.ENOSPC:
		s = verbs.ErrLimit
	case syscall.EBUSY:
		s = verbs.ErrBusy
	case syscall.EOPNOTSUPP, syscall.ENOSYS, syscall.EPROTONOSUPPORT:
		s = verbs.ErrUnsupported
	case syscall.ENODEV, syscall.ENXIO:
		s = verbs.ErrNoDevice
	}
	if s == nil {
		return fmt.Errorf("ibverbs: %s: %w", what, e)
	}
	return fmt.Errorf("ibverbs: %s: %w (%w)", what, s, e)
}

// lastErr is errnoErr for calls that return NULL and set errno.
func lastErr(what string) error { return errnoErr(what, C.krc_errno()) }

// cAlloc returns n zeroed elements of T in C memory; free with cFree.
func cAlloc[T any](n int) *T {
	var zero T
	p := C.calloc(C.size_t(max(n, 1)), C.size_t(unsafe.Sizeof(zero)))
	if p == nil {
		panic("ibverbs: calloc failed")
	}
	return (*T)(p)
}

func cFree[T any](p *T) {
	if p != nil {
		C.free(unsafe.Pointer(p))
	}
}

// --- devices ---------------------------------------------------------------

// listDevices returns the names of the devices libibverbs sees.
func listDevices() ([]string, error) {
	var n C.int
	list := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, lastErr("ibv_get_device_list")
	}
	defer C.ibv_free_device_list(list)
	names := make([]string, int(n))
	for i := range names {
		names[i] = C.GoString(C.krc_device_name(list, C.int(i)))
	}
	return names, nil
}

// openDevice opens the device called name ("" is the first).
func openDevice(name string) (*cContext, string, error) {
	var n C.int
	list := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, "", lastErr("ibv_get_device_list")
	}
	defer C.ibv_free_device_list(list)
	for i := 0; i < int(n); i++ {
		dn := C.GoString(C.krc_device_name(list, C.int(i)))
		if name != "" && dn != name {
			continue
		}
		ctx := C.krc_open(list, C.int(i))
		if ctx == nil {
			return nil, "", lastErr("ibv_open_device " + dn)
		}
		return ctx, dn, nil
	}
	if name == "" {
		return nil, "", fmt.Errorf("ibverbs: no RDMA device found: %w", verbs.ErrNoDevice)
	}
	return nil, "", fmt.Errorf("ibverbs: device %q: %w", name, verbs.ErrNoDevice)
}

func closeDevice(ctx *cContext) error {
	if rc := C.ibv_close_device(ctx); rc != 0 {
		return lastErr("ibv_close_device")
	}
	return nil
}

// devInfo is what Open learns about a device and port.
type devInfo struct {
	attr         verbs.DeviceAttr
	vendorID     uint32
	maxRdAtomic  int // responder resources per QP (max_qp_rd_atom)
	maxInitAtom  int // initiator depth per QP (max_qp_init_rd_atom)
	port         verbs.PortAttr
	ethernet     bool
	activeMTU    int // ibv_mtu enum of the port
	gidTableSize int
}

// queryDevice reads the device's limits and the port's attributes.
func queryDevice(ctx *cContext, port int) (devInfo, error) {
	var info devInfo
	var da C.struct_ibv_device_attr
	if rc := C.ibv_query_device(ctx, &da); rc != 0 {
		return info, errnoErr("ibv_query_device", rc)
	}
	var pa C.struct_ibv_port_attr
	if rc := C.krc_query_port(ctx, C.uint8_t(port), &pa); rc != 0 {
		return info, errnoErr(fmt.Sprintf("ibv_query_port %d", port), rc)
	}
	info.attr = verbs.DeviceAttr{
		MaxQP:        int(da.max_qp),
		MaxQPWR:      int(da.max_qp_wr),
		MaxSGE:       int(da.max_sge),
		MaxCQ:        int(da.max_cq),
		MaxCQE:       int(da.max_cqe),
		MaxMR:        int(da.max_mr),
		MaxMRSize:    uint64(da.max_mr_size),
		MaxPD:        int(da.max_pd),
		MaxSRQ:       int(da.max_srq),
		MaxSRQWR:     int(da.max_srq_wr),
		MaxMsgSize:   uint32(pa.max_msg_sz),
		AtomicCap:    da.atomic_cap != C.IBV_ATOMIC_NONE,
		SRQSupported: da.max_srq > 0,
	}
	info.vendorID = uint32(da.vendor_id)
	info.maxRdAtomic = int(da.max_qp_rd_atom)
	info.maxInitAtom = int(da.max_qp_init_rd_atom)
	info.ethernet = pa.link_layer == C.IBV_LINK_LAYER_ETHERNET
	info.activeMTU = int(pa.active_mtu)
	info.gidTableSize = int(pa.gid_tbl_len)
	info.port = verbs.PortAttr{
		Num:    port,
		Active: pa.state == C.IBV_PORT_ACTIVE,
		MTU:    mtuBytes(int(pa.active_mtu)),
		LID:    uint16(pa.lid),
	}
	return info, nil
}

// GID types as ibv_gid_type numbers them.
const (
	gidTypeIB     = C.IBV_GID_TYPE_IB
	gidTypeRoCEv1 = C.IBV_GID_TYPE_ROCE_V1
	gidTypeRoCEv2 = C.IBV_GID_TYPE_ROCE_V2
)

// queryGID reads one GID table entry; ok is false for an empty entry.
func queryGID(ctx *cContext, port, idx int) (g verbs.GID, typ int, ok bool) {
	var ct C.int
	rc := C.krc_query_gid(ctx, C.uint8_t(port), C.int(idx), (*C.uint8_t)(unsafe.Pointer(&g[0])), &ct)
	return g, int(ct), rc == 0 && g != (verbs.GID{})
}

// mtuBytes converts an ibv_mtu to bytes.
func mtuBytes(m int) int {
	if m < 1 || m > 5 {
		return 0
	}
	return 128 << m
}

// mtuEnum converts bytes to the largest ibv_mtu not above them.
func mtuEnum(b int) int {
	for m := 5; m > 1; m-- {
		if 128<<m <= b {
			return m
		}
	}
	return 1
}

// --- PD, MR, AH ------------------------------------------------------------

func allocPD(ctx *cContext) (*cPD, error) {
	p := C.ibv_alloc_pd(ctx)
	if p == nil {
		return nil, lastErr("ibv_alloc_pd")
	}
	return p, nil
}

func deallocPD(p *cPD) error {
	if rc := C.ibv_dealloc_pd(p); rc != 0 {
		return errnoErr("ibv_dealloc_pd", rc)
	}
	return nil
}

// regMR registers n bytes at addr, which the caller checked is off-heap.
func regMR(p *cPD, addr uint64, n int, access verbs.Access) (*cMR, uint32, uint32, error) {
	m := C.krc_reg_mr(p, C.uint64_t(addr), C.size_t(n), C.int(access))
	if m == nil {
		return nil, 0, 0, lastErr("ibv_reg_mr")
	}
	return m, uint32(m.lkey), uint32(m.rkey), nil
}

func deregMR(m *cMR) error {
	if rc := C.ibv_dereg_mr(m); rc != 0 {
		return errnoErr("ibv_dereg_mr", rc)
	}
	return nil
}

func createAH(p *cPD, port int, global bool, gid verbs.GID, sgid int, lid uint16) (*cAH, error) {
	g := 0
	if global {
		g = 1
	}
	ah := C.krc_create_ah(p, C.int(port), C.int(g), (*C.uint8_t)(unsafe.Pointer(&gid[0])), C.int(sgid), C.uint16_t(lid))
	if ah == nil {
		return nil, lastErr("ibv_create_ah")
	}
	return ah, nil
}

func destroyAH(ah *cAH) error {
	if rc := C.ibv_destroy_ah(ah); rc != 0 {
		return errnoErr("ibv_destroy_ah", rc)
	}
	return nil
}

// --- CQ and completion channel ----------------------------------------------

// createCQ makes a CQ of at least n entries bound to a new completion
// channel, and returns the channel's fd.
func createCQ(ctx *cContext, n int) (*cCQ, *cChannel, int, int, error) {
	ch := C.ibv_create_comp_channel(ctx)
	if ch == nil {
		return nil, nil, 0, -1, lastErr("ibv_create_comp_channel")
	}
	cq := C.ibv_create_cq(ctx, C.int(n), nil, ch, 0)
	if cq == nil {
		err := lastErr(fmt.Sprintf("ibv_create_cq(%d)", n))
		C.ibv_destroy_comp_channel(ch)
		return nil, nil, 0, -1, err
	}
	return cq, ch, int(cq.cqe), int(ch.fd), nil
}

func destroyCQ(cq *cCQ, ch *cChannel) error {
	var err error
	if rc := C.ibv_destroy_cq(cq); rc != 0 {
		err = errnoErr("ibv_destroy_cq", rc)
	}
	if rc := C.ibv_destroy_comp_channel(ch); rc != 0 && err == nil {
		err = errnoErr("ibv_destroy_comp_channel", rc)
	}
	return err
}

// pollCQ polls up to n (<= pollBatch) completions into out via tmp.
func pollCQ(cq *cCQ, n int, tmp *C.struct_ibv_wc, out *cWC) (int, error) {
	k := C.krc_poll_cq(cq, C.int(n), tmp, out)
	if k < 0 {
		return 0, errnoErr("ibv_poll_cq", k)
	}
	return int(k), nil
}

func reqNotify(cq *cCQ) error {
	if rc := C.krc_req_notify_cq(cq); rc != 0 {
		return errnoErr("ibv_req_notify_cq", rc)
	}
	return nil
}

// errAgain is getCQEvent's "nothing yet" on a non-blocking channel.
var errAgain = errors.New("ibverbs: no completion event yet")

// getCQEvent consumes and acknowledges one completion event.
func getCQEvent(ch *cChannel) error {
	rc := C.krc_get_cq_event(ch)
	switch {
	case rc == 0:
		return nil
	case syscall.Errno(-rc) == syscall.EAGAIN:
		return errAgain
	}
	return errnoErr("ibv_get_cq_event", rc)
}

// wcSlice views n C completions as a Go slice (the memory stays C's).
func wcSlice(p *cWC, n int) []cWC { return unsafe.Slice(p, n) }

// wcFields copies one completion out of C memory.
func wcFields(w *cWC) (id uint64, status, opcode, byteLen, imm, qpn, srcQP, flags uint32) {
	return uint64(w.wr_id), uint32(w.status), uint32(w.opcode), uint32(w.byte_len), uint32(w.imm),
		uint32(w.qp_num), uint32(w.src_qp), uint32(w.wc_flags)
}

// Completion opcodes and flags as ibv_wc_opcode / ibv_wc_flags number them.
const (
	wcOpSend       = C.IBV_WC_SEND
	wcOpWrite      = C.IBV_WC_RDMA_WRITE
	wcOpRead       = C.IBV_WC_RDMA_READ
	wcOpCompSwap   = C.IBV_WC_COMP_SWAP
	wcOpFetchAdd   = C.IBV_WC_FETCH_ADD
	wcOpRecv       = C.IBV_WC_RECV
	wcOpRecvImm    = C.IBV_WC_RECV_RDMA_WITH_IMM
	wcFlagWithImm  = C.IBV_WC_WITH_IMM
	ibvWCSuccess   = C.IBV_WC_SUCCESS
	ibvWCFlushErr  = C.IBV_WC_WR_FLUSH_ERR
	ibvWCGeneralEr = C.IBV_WC_GENERAL_ERR
)

// --- QP and SRQ --------------------------------------------------------------

// QP types, states, attribute masks and work-request constants as
// libibverbs numbers them.
const (
	qptRC = C.IBV_QPT_RC
	qptUC = C.IBV_QPT_UC
	qptUD = C.IBV_QPT_UD

	maskState       = C.IBV_QP_STATE
	maskAccess      = C.IBV_QP_ACCESS_FLAGS
	maskPKey        = C.IBV_QP_PKEY_INDEX
	maskPort        = C.IBV_QP_PORT
	maskQKey        = C.IBV_QP_QKEY
	maskAV          = C.IBV_QP_AV
	maskPathMTU     = C.IBV_QP_PATH_MTU
	maskTimeout     = C.IBV_QP_TIMEOUT
	maskRetryCnt    = C.IBV_QP_RETRY_CNT
	maskRNRRetry    = C.IBV_QP_RNR_RETRY
	maskRQPSN       = C.IBV_QP_RQ_PSN
	maskMaxRdAtomic = C.IBV_QP_MAX_QP_RD_ATOMIC
	maskMinRNRTimer = C.IBV_QP_MIN_RNR_TIMER
	maskSQPSN       = C.IBV_QP_SQ_PSN
	maskMaxDestRd   = C.IBV_QP_MAX_DEST_RD_ATOMIC
	maskDestQPN     = C.IBV_QP_DEST_QPN

	wrWrite    = C.IBV_WR_RDMA_WRITE
	wrWriteImm = C.IBV_WR_RDMA_WRITE_WITH_IMM
	wrSend     = C.IBV_WR_SEND
	wrSendImm  = C.IBV_WR_SEND_WITH_IMM
	wrRead     = C.IBV_WR_RDMA_READ
	wrCAS      = C.IBV_WR_ATOMIC_CMP_AND_SWP
	wrFAA      = C.IBV_WR_ATOMIC_FETCH_AND_ADD

	sendFence     = C.IBV_SEND_FENCE
	sendSignaled  = C.IBV_SEND_SIGNALED
	sendSolicited = C.IBV_SEND_SOLICITED
	sendInline    = C.IBV_SEND_INLINE
)

// qpCaps are the queue sizes asked for and, after creation, granted.
type qpCaps struct {
	sendWR, recvWR, sendSGE, recvSGE, inline int
}

func createQP(p *cPD, typ int, scq, rcq *cCQ, srq *cSRQ, c qpCaps, sigAll bool) (*cQP, uint32, qpCaps, error) {
	cap := C.struct_ibv_qp_cap{
		max_send_wr:     C.uint32_t(c.sendWR),
		max_recv_wr:     C.uint32_t(c.recvWR),
		max_send_sge:    C.uint32_t(c.sendSGE),
		max_recv_sge:    C.uint32_t(c.recvSGE),
		max_inline_data: C.uint32_t(c.inline),
	}
	sa := 0
	if sigAll {
		sa = 1
	}
	qp := C.krc_create_qp(p, C.int(typ), scq, rcq, srq, &cap, C.int(sa))
	if qp == nil {
		return nil, 0, c, lastErr("ibv_create_qp")
	}
	got := qpCaps{int(cap.max_send_wr), int(cap.max_recv_wr), int(cap.max_send_sge), int(cap.max_recv_sge), int(cap.max_inline_data)}
	return qp, uint32(qp.qp_num), got, nil
}

func destroyQP(qp *cQP) error {
	if rc := C.ibv_destroy_qp(qp); rc != 0 {
		return errnoErr("ibv_destroy_qp", rc)
	}
	return nil
}

// modifyAttr is the Go side of krc_modify.
type modifyAttr struct {
	mask, state, access, port, mtu           int
	qkey, destQPN, rqPSN, sqPSN              uint32
	minRNRTimer, timeout, retryCnt, rnrRetry int
	maxRdAtomic, maxDestRdAtomic             int
	global                                   bool
	dgid                                     verbs.GID
	sgidIndex                                int
	dlid                                     uint16
}

func modifyQP(qp *cQP, a modifyAttr) error {
	m := C.krc_modify{
		mask: C.int(a.mask), state: C.int(a.state), access: C.int(a.access), qkey: C.uint32_t(a.qkey),
		port: C.int(a.port), mtu: C.int(a.mtu), dest_qpn: C.uint32_t(a.destQPN), rq_psn: C.uint32_t(a.rqPSN),
		sq_psn: C.uint32_t(a.sqPSN), min_rnr_timer: C.int(a.minRNRTimer), timeout: C.int(a.timeout),
		retry_cnt: C.int(a.retryCnt), rnr_retry: C.int(a.rnrRetry), max_rd_atomic: C.int(a.maxRdAtomic),
		max_dest_rd_atomic: C.int(a.maxDestRdAtomic), sgid_index: C.int(a.sgidIndex), dlid: C.uint16_t(a.dlid),
	}
	if a.global {
		m.is_global = 1
		for i, b := range a.dgid {
			m.dgid[i] = C.uint8_t(b)
		}
	}
	if rc := C.krc_modify_qp(qp, &m); rc != 0 {
		return errnoErr(fmt.Sprintf("ibv_modify_qp to %s", verbs.QPState(a.state)), rc)
	}
	return nil
}

// queryQPState asks the device for the QP's state.
func queryQPState(qp *cQP) (verbs.QPState, error) {
	rc := C.krc_query_qp_state(qp)
	if rc < 0 {
		return 0, errnoErr("ibv_query_qp", rc)
	}
	return verbs.QPState(rc), nil
}

func createSRQ(p *cPD, maxWR, maxSGE int) (*cSRQ, error) {
	s := C.krc_create_srq(p, C.uint32_t(maxWR), C.uint32_t(maxSGE))
	if s == nil {
		return nil, lastErr("ibv_create_srq")
	}
	return s, nil
}

func destroySRQ(s *cSRQ) error {
	if rc := C.ibv_destroy_srq(s); rc != 0 {
		return errnoErr("ibv_destroy_srq", rc)
	}
	return nil
}

// postScratch is a QP's (or SRQ's) C memory for building work requests:
// allocated once, reused by every post under the owner's lock.
type postScratch struct {
	swr   *cSWR
	rwr   *cRWR
	sges  *cSGE
	wrs   *C.struct_ibv_send_wr
	rwrs  *C.struct_ibv_recv_wr
	nsges int
}

func newPostScratch(maxSGE int) *postScratch {
	n := postBatch * max(maxSGE, 1)
	return &postScratch{
		swr:   cAlloc[cSWR](postBatch),
		rwr:   cAlloc[cRWR](postBatch),
		sges:  cAlloc[cSGE](n),
		wrs:   cAlloc[C.struct_ibv_send_wr](postBatch),
		rwrs:  cAlloc[C.struct_ibv_recv_wr](postBatch),
		nsges: n,
	}
}

func (s *postScratch) free() {
	cFree(s.swr)
	cFree(s.rwr)
	cFree(s.sges)
	cFree(s.wrs)
	cFree(s.rwrs)
	*s = postScratch{}
}

// swrs, rwrs and sgl view the scratch arrays as Go slices of C memory.
func (s *postScratch) swrs() []cSWR   { return unsafe.Slice(s.swr, postBatch) }
func (s *postScratch) rwrsGo() []cRWR { return unsafe.Slice(s.rwr, postBatch) }
func (s *postScratch) sgl() []cSGE    { return unsafe.Slice(s.sges, s.nsges) }

// setSGE fills one C SGE.
func setSGE(c *cSGE, g verbs.SGE) {
	c.addr = C.uint64_t(g.Addr)
	c.length = C.uint32_t(g.Length)
	c.lkey = C.uint32_t(g.LKey)
}

// setSWR fills one C send work request.
func setSWR(c *cSWR, id uint64, opcode, flags int, wr *verbs.SendWR, ah *cAH, nsge, sgeOff int) {
	*c = cSWR{
		wr_id: C.uint64_t(id), remote_addr: C.uint64_t(wr.RemoteAddr), compare_add: C.uint64_t(wr.CompareAdd),
		swap: C.uint64_t(wr.Swap), ah: ah, imm: C.uint32_t(wr.Imm), rkey: C.uint32_t(wr.RKey),
		remote_qpn: C.uint32_t(wr.RemoteQPN), remote_qkey: C.uint32_t(wr.QKey), opcode: C.uint32_t(opcode),
		send_flags: C.uint32_t(flags), num_sge: C.uint32_t(nsge), sge_off: C.uint32_t(sgeOff),
	}
}

// setRWR fills one C receive work request.
func setRWR(c *cRWR, id uint64, nsge, sgeOff int) {
	*c = cRWR{wr_id: C.uint64_t(id), num_sge: C.uint32_t(nsge), sge_off: C.uint32_t(sgeOff)}
}

// postSend posts the first n prepared send WRs; it returns how many the
// device accepted.
func postSend(qp *cQP, s *postScratch, n int) (int, error) {
	var done C.int
	if rc := C.krc_post_send(qp, s.swr, s.sges, s.wrs, C.int(n), &done); rc != 0 {
		return int(done), errnoErr("ibv_post_send", rc)
	}
	return int(done), nil
}

// postRecv posts the first n prepared receives to qp, or to srq if non-nil.
func postRecv(qp *cQP, srq *cSRQ, s *postScratch, n int) (int, error) {
	var done C.int
	if rc := C.krc_post_recv(qp, srq, s.rwr, s.sges, s.rwrs, C.int(n), &done); rc != 0 {
		return int(done), errnoErr("ibv_post_recv", rc)
	}
	return int(done), nil
}

// pollScratch is a CQ's C memory for polling.
type pollScratch struct {
	tmp *C.struct_ibv_wc
	out *cWC
}

func newPollScratch() *pollScratch {
	return &pollScratch{tmp: cAlloc[C.struct_ibv_wc](pollBatch), out: cAlloc[cWC](pollBatch)}
}

func (s *pollScratch) free() {
	cFree(s.tmp)
	cFree(s.out)
	*s = pollScratch{}
}
