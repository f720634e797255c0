/*
 * krcore.h - a C client of krcored, KRCore's shared RDMA runtime.
 *
 * One self-contained C11 header (static inline functions, libc and Linux
 * headers only) that speaks krcored's protocol: control messages on the
 * daemon's SOCK_SEQPACKET Unix socket, memfds and eventfds passed with
 * SCM_RIGHTS, and per-VQ rings in shared memory. It is what KRCore's C shim
 * offered, over the Go daemon. The protocol itself is documented in package
 * daemon/wire (`go doc ./daemon/wire`); every constant and layout here is
 * checked against it by `go test ./daemon` (cshim_test.go), so the two cannot
 * drift apart silently.
 *
 * Why a header only: a C program needs nothing but `#include "krcore.h"`
 * and its usual compiler command; there is no library to build, install or
 * version next to krcored. The functions are small; the few big ones are
 * the control calls, which cost a socket round trip anyway.
 *
 * Build:
 *
 *     cc -std=c11 -O2 -Wall -Wextra -I include prog.c -o prog
 *
 * Include krcore.h before any system header (it defines _GNU_SOURCE for
 * memfd_create, eventfd and SCM_RIGHTS), or compile with -D_GNU_SOURCE.
 * Little-endian hosts only, like the protocol's in-memory layouts.
 *
 * Use (error handling elided; every call returns -1 on failure with
 * krc_error(c) describing it, c->code the daemon's KRC_CODE_* and errno set):
 *
 *     struct krc_client c;   struct krc_mr mr;   struct krc_vq q;
 *     struct krc_region g;   struct krc_cqe cqe;
 *     krc_attach(&c, NULL);                       // NULL: default socket
 *     krc_reg_mr(&c, 4096, KRC_ACCESS_LOCAL_WRITE, &mr);
 *     krc_queue(&c, &q);
 *     krc_connect(&q, 2);                         // node 2
 *     krc_region(&c, 2, "table", &g);             // what node 2 exports
 *     struct krc_sqe e = { .op = KRC_WR_READ, .mr = mr.id, .off = 0,
 *                          .len = 64, .region = g.id, .remote_off = 0 };
 *     int64_t seq = krc_push(&q, &e);             // -1/EAGAIN: no credit
 *     krc_pop_wait(&q, &cqe, 1, 5000);            // cqe.seq == seq
 *     if (cqe.status == KRC_WC_SUCCESS) ... mr.addr holds the bytes ...
 *     krc_close_vq(&q);  krc_dereg_mr(&c, &mr);  krc_detach(&c);
 *
 * Model. A struct krc_client and its VQs belong to one thread at a time (no
 * locking inside; use one client per thread, or lock around it). Control
 * calls (attach, register, region, queue, connect ...) are round trips on
 * the socket, bounded by c->timeout_ms (10 s by default). Pushes and
 * completions never touch the socket: krc_push writes an SQE and stores the
 * submission tail, ringing the doorbell eventfd only if the daemon sleeps;
 * krc_pop reads CQEs up to the completion tail; krc_pop_wait spins for
 * KRC_SPIN_NS (a message wait not after a push that rang the doorbell), then raises the sleep flag, checks again and sleeps in poll()
 * on the completion eventfd and the socket (so a daemon that goes away wakes
 * it: the call fails with KRC_CODE_CLOSED and errno EPIPE, and requests in
 * flight are lost, which the Go client reports as WR_FLUSH_ERR).
 *
 * Completions carry the request's sequence number (krc_push's return
 * value: the count of SQEs written before it, receives included), not an
 * id of the caller's choosing: map it back yourself. Unsignaled requests
 * (KRC_SQE_UNSIGNALED) get no CQE; credits are counted against the daemon's
 * retired counter, which advances when completions are published, so a run
 * of more than c->credits unsignaled requests must end with a signaled one.
 *
 * Isolation. MR, region and VQ ids are looked up in this client's own tables
 * in the daemon: naming another client's MR or region completes the request
 * with an error status (LOC_PROT_ERR / REM_ACCESS_ERR ...) on this VQ only,
 * and control calls on it fail with KRC_CODE_REFUSED. When the process exits
 * or dies, the daemon reclaims everything it owned.
 *
 * Not here: the Go client's OpStats decoding (krcore.Stats' field list is Go's)
 * and C++ (the header uses C11 _Atomic).
 */
#ifndef KRCORE_H
#define KRCORE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#if defined(__GLIBC__) && !defined(__USE_GNU)
#error "krcore.h: include it before any system header, or compile with -D_GNU_SOURCE"
#endif
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "krcore.h: the protocol's shared-memory layouts are little-endian"
#endif

/* ---- Protocol constants (package daemon/wire) ------------------------- */

#define KRC_VERSION 1               /* wire.Version, sent in OpHello */
#define KRC_HEADER_LEN 16           /* wire.HeaderLen */
#define KRC_MAX_MESSAGE (64 << 10)  /* wire.MaxMessage */
#define KRC_SPIN_NS 10000           /* wire.SpinFor */

/* Control messages (wire.Op...). Bodies: request; response. */
enum krc_op {
	KRC_OP_HELLO = 1,   /* u32 version; u64 client, u64 node, u32 credits, u32 max message[, u32 features] */
	KRC_OP_REGISTER,    /* fd memfd, u64 off, u64 len, u32 access; u64 mr */
	KRC_OP_DEREGISTER,  /* u64 mr; - */
	KRC_OP_EXPORT,      /* str name, u64 mr, u64 off, u64 len, u32 access[, u32 k, k of (u64 node, u32 port)]; - */
	KRC_OP_UNEXPORT,    /* str name; - */
	KRC_OP_REGION,      /* u64 node, str name; u64 region, u64 len, u32 access, u64 addr */
	KRC_OP_QUEUE,       /* fds ring memfd, doorbell, completion bell, message bell; u64 vq */
	KRC_OP_CONNECT,     /* u64 vq, u64 node, u8 to port, u32 port; - */
	KRC_OP_BIND,        /* u64 vq, u32 port; - */
	KRC_OP_UNBIND,      /* u64 vq; - */
	KRC_OP_CLOSE_VQ,    /* u64 vq; - */
	KRC_OP_STATS,       /* -; krcore.Stats as u64s */
	KRC_OP_STATUS,      /* -; str JSON */
	KRC_OP_BYE,         /* daemon to client, unasked: str reason */
	KRC_OP_VQ_REGION    /* u64 vq, str name; u64 region, u64 len, u32 access, u64 node */
};

/* Error codes in a response's header (wire.Code...). */
enum krc_code {
	KRC_CODE_OK = 0,
	KRC_CODE_OTHER,
	KRC_CODE_CLOSED,
	KRC_CODE_NOT_CONNECTED,
	KRC_CODE_PORT_IN_USE,
	KRC_CODE_NO_REGION,
	KRC_CODE_UNREACHABLE,
	KRC_CODE_REFUSED,
	KRC_CODE_INVALID,
	KRC_CODE_BUSY,
	KRC_CODE_DEADLINE,
	KRC_CODE_LIMIT,
	KRC_CODE_CANCELED
};

/* Ring geometry (wire.SQEntries ...). */
#define KRC_SQ_ENTRIES 256
#define KRC_CQ_ENTRIES 256
#define KRC_MSG_ENTRIES 32
#define KRC_SQE_LEN 64
#define KRC_CQE_LEN 16
#define KRC_MSGHDR_LEN 64
#define KRC_RING_HEADER_LEN 4096  /* counters, one cache line each */
#define KRC_LINE_LEN 64

/* Counters and flags in a VQ's ring header (wire.SQTail ...). */
enum krc_ctr {
	KRC_CTR_SQ_TAIL = 0,      /* client: SQEs published */
	KRC_CTR_SQ_HEAD,          /* daemon: SQEs consumed */
	KRC_CTR_CQ_TAIL,          /* daemon: CQEs published */
	KRC_CTR_CQ_HEAD,          /* client: CQEs consumed */
	KRC_CTR_RETIRED,          /* daemon: requests finished (unsignaled included) */
	KRC_CTR_MSG_TAIL,         /* daemon: messages published */
	KRC_CTR_MSG_HEAD,         /* client: messages consumed */
	KRC_CTR_DAEMON_SLEEPS,    /* flag: daemon sleeps on the doorbell */
	KRC_CTR_DAEMON_FULL_CQ,   /* flag: daemon waits for completion ring space */
	KRC_CTR_DAEMON_FULL_MSG,  /* flag: daemon waits for message ring space */
	KRC_CTR_CLIENT_CQ,        /* flag: client sleeps on the completion bell */
	KRC_CTR_CLIENT_MSG,       /* flag: client sleeps on the message bell */
	KRC_CTR_COUNT
};

#define KRC_OP_RECV 0xfe          /* wire.OpRecv: SQE op posting a receive buffer */
#define KRC_SQE_UNSIGNALED 1      /* wire.FlagUnsignaled */
#define KRC_MSG_IN_BUF 1          /* wire.MsgInBuf: landed in the oldest posted buffer */
#define KRC_MSG_HAS_IMM 2         /* wire.MsgHasImm */
#define KRC_MSG_WRITE 4           /* wire.MsgWrite: a WRITE_WITH_IMM's notification */

/* SQE opcodes (verbs.Opcode). */
enum krc_wr_op {
	KRC_WR_SEND = 1,
	KRC_WR_SEND_IMM,
	KRC_WR_WRITE,
	KRC_WR_WRITE_IMM,
	KRC_WR_READ,
	KRC_WR_COMPARE_SWAP,
	KRC_WR_FETCH_ADD
};

/* Access rights (verbs.Access, ibv_access_flags). */
enum krc_access {
	KRC_ACCESS_LOCAL_WRITE = 1 << 0,
	KRC_ACCESS_REMOTE_WRITE = 1 << 1,
	KRC_ACCESS_REMOTE_READ = 1 << 2,
	KRC_ACCESS_REMOTE_ATOMIC = 1 << 3,
	KRC_ACCESS_ALL = 15
};

/* Completion statuses (verbs.Status, ibv_wc_status order). */
enum krc_wc_status {
	KRC_WC_SUCCESS = 0,
	KRC_WC_LOC_LEN_ERR,
	KRC_WC_LOC_QP_OP_ERR,
	KRC_WC_LOC_EEC_OP_ERR,
	KRC_WC_LOC_PROT_ERR,
	KRC_WC_WR_FLUSH_ERR,
	KRC_WC_MW_BIND_ERR,
	KRC_WC_BAD_RESP_ERR,
	KRC_WC_LOC_ACCESS_ERR,
	KRC_WC_REM_INV_REQ_ERR,
	KRC_WC_REM_ACCESS_ERR,
	KRC_WC_REM_OP_ERR,
	KRC_WC_RETRY_EXC_ERR,
	KRC_WC_RNR_RETRY_EXC_ERR,
	KRC_WC_LOC_RDD_VIOL_ERR,
	KRC_WC_REM_INV_RD_REQ_ERR,
	KRC_WC_REM_ABORT_ERR,
	KRC_WC_INV_EECN_ERR,
	KRC_WC_INV_EEC_STATE_ERR,
	KRC_WC_FATAL_ERR,
	KRC_WC_RESP_TIMEOUT_ERR,
	KRC_WC_GENERAL_ERR
};

/* krc_status_str names a completion status as verbs.Status.String does. */
static inline const char *krc_status_str(uint32_t s)
{
	static const char *const names[] = {
		"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
		"WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR",
		"REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR",
		"RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR",
		"REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR",
		"RESP_TIMEOUT_ERR", "GENERAL_ERR",
	};
	return s < sizeof names / sizeof names[0] ? names[s] : "UNKNOWN_STATUS";
}

/* ---- Shared-memory layouts -------------------------------------------- */

/* One request on the submission ring (wire.SQE). */
struct krc_sqe {
	uint8_t op;          /* KRC_WR_... or KRC_OP_RECV */
	uint8_t flags;       /* KRC_SQE_UNSIGNALED */
	uint16_t reserved;   /* zero */
	uint32_t imm;        /* immediate data (SEND_IMM, WRITE_IMM) */
	uint64_t mr;         /* local MR id (krc_mr.id); 0 with len 0 */
	uint64_t off, len;   /* local range in the MR */
	uint64_t region;     /* remote region id (krc_region.id); 0 for sends */
	uint64_t remote_off; /* offset in the region */
	uint64_t compare, swap; /* atomics: compare (or add) and swap */
};

/* One completion (wire.CQE). */
struct krc_cqe {
	uint64_t seq;    /* the request's sequence number (krc_push's result) */
	uint32_t status; /* KRC_WC_... */
	uint32_t len;    /* bytes moved */
};

/* One received message's header (wire.MsgHdr); the data follows it in the
 * ring unless flags has KRC_MSG_IN_BUF or KRC_MSG_WRITE. With KRC_MSG_WRITE
 * it is the notification of a WRITE_WITH_IMM sent to the bound port: len
 * bytes were written into a region this node exports, and are in place;
 * it has no data and took no posted buffer. */
struct krc_msghdr {
	uint32_t flags;  /* KRC_MSG_IN_BUF, KRC_MSG_HAS_IMM, KRC_MSG_WRITE */
	uint32_t status; /* KRC_WC_...: LOC_LEN_ERR when cut to the posted buffer */
	uint32_t len;    /* bytes of data, or with KRC_MSG_WRITE bytes written */
	uint32_t imm;    /* with KRC_MSG_HAS_IMM */
	uint64_t from;   /* sender's node */
	uint32_t port;   /* the port the sender is bound to (0 if none): reply there */
	uint8_t reserved[36];
};

_Static_assert(sizeof(struct krc_sqe) == KRC_SQE_LEN, "SQE layout");
_Static_assert(offsetof(struct krc_sqe, imm) == 4 && offsetof(struct krc_sqe, mr) == 8 &&
		       offsetof(struct krc_sqe, swap) == 56, "SQE layout");
_Static_assert(sizeof(struct krc_cqe) == KRC_CQE_LEN, "CQE layout");
_Static_assert(sizeof(struct krc_msghdr) == KRC_MSGHDR_LEN, "message header layout");
_Static_assert(offsetof(struct krc_msghdr, from) == 16 && offsetof(struct krc_msghdr, port) == 24,
	       "message header layout");
_Static_assert(KRC_CTR_COUNT * KRC_LINE_LEN <= KRC_RING_HEADER_LEN, "ring header");

/* A VQ's ring memory as one side sees it (wire.Ring). */
struct krc_ring {
	uint8_t *mem;
	size_t size;
	uint32_t max_msg;
};

static inline size_t krc__page_round(size_t n)
{
	size_t p = (size_t)sysconf(_SC_PAGESIZE);
	return (n + p - 1) & ~(p - 1);
}

/* krc_ring_size is the length of a VQ's ring memfd (wire.RingSize). */
static inline size_t krc_ring_size(uint32_t max_msg)
{
	return krc__page_round((size_t)KRC_RING_HEADER_LEN + (size_t)KRC_SQ_ENTRIES * KRC_SQE_LEN +
			       (size_t)KRC_CQ_ENTRIES * KRC_CQE_LEN +
			       (size_t)KRC_MSG_ENTRIES * (KRC_MSGHDR_LEN + (size_t)max_msg));
}

/* krc_ring_ctr is counter or flag i (KRC_CTR_...), a 64-bit atomic; every
 * access is sequentially consistent, as Go's atomic.Uint64. */
static inline _Atomic uint64_t *krc_ring_ctr(const struct krc_ring *r, int i)
{
	return (_Atomic uint64_t *)(void *)(r->mem + (size_t)i * KRC_LINE_LEN);
}

/* krc_ring_sqe is the slot of the SQE of sequence number seq. */
static inline struct krc_sqe *krc_ring_sqe(const struct krc_ring *r, uint64_t seq)
{
	return (struct krc_sqe *)(void *)(r->mem + KRC_RING_HEADER_LEN +
					  (size_t)(seq % KRC_SQ_ENTRIES) * KRC_SQE_LEN);
}

/* krc_ring_cqe is the slot of completion number i. */
static inline struct krc_cqe *krc_ring_cqe(const struct krc_ring *r, uint64_t i)
{
	return (struct krc_cqe *)(void *)(r->mem + KRC_RING_HEADER_LEN +
					  (size_t)KRC_SQ_ENTRIES * KRC_SQE_LEN +
					  (size_t)(i % KRC_CQ_ENTRIES) * KRC_CQE_LEN);
}

/* krc_ring_msg is the slot of message number i: a header, then up to
 * max_msg bytes of data. */
static inline struct krc_msghdr *krc_ring_msg(const struct krc_ring *r, uint64_t i)
{
	return (struct krc_msghdr *)(void *)(r->mem + KRC_RING_HEADER_LEN +
					     (size_t)KRC_SQ_ENTRIES * KRC_SQE_LEN +
					     (size_t)KRC_CQ_ENTRIES * KRC_CQE_LEN +
					     (size_t)(i % KRC_MSG_ENTRIES) * (KRC_MSGHDR_LEN + r->max_msg));
}

/* ---- Client ----------------------------------------------------------- */

/* A process's attachment to krcored. */
struct krc_client {
	int fd;             /* the SOCK_SEQPACKET socket */
	uint64_t id;        /* the daemon's id for this client (krctl lists it) */
	uint64_t node;      /* the daemon's node */
	uint32_t credits;   /* requests a VQ may have outstanding */
	uint32_t max_msg;   /* largest message */
	int timeout_ms;     /* bound on a control call; default 10000 */
	int code;           /* KRC_CODE_... of the last failure */
	int gone;           /* the daemon said goodbye or closed the socket */
	char err[512];      /* text of the last failure */
	/* control message in progress (request, then its response) */
	uint64_t seq;
	size_t n, off;
	int bad;
	uint8_t msg[KRC_MAX_MESSAGE];
};

/* Memory registered with the daemon: a sealed memfd mapped here and there. */
struct krc_mr {
	uint64_t id;  /* the daemon's id, for SQEs and krc_export */
	void *addr;   /* the memory, len bytes */
	size_t len;
	int fd;       /* the memfd (-1 once released) */
};

/* A region another node exports, as learned with krc_region. */
struct krc_region {
	uint64_t id;  /* the daemon's id, for SQEs */
	uint64_t len;
	uint32_t access;
	uint64_t addr;
};

/* A virtual queue: its rings here and the daemon's, and three eventfds. */
struct krc_vq {
	struct krc_client *c;
	uint64_t id;
	uint64_t node;       /* connected node, 0 if none */
	struct krc_ring ring;
	int door;            /* we write it: SQEs published, ring space freed */
	int cq_bell;         /* the daemon writes it: completions */
	int msg_bell;        /* the daemon writes it: messages */
	uint64_t sq_tail;    /* SQEs written (the next sequence number) */
	uint64_t pushed;     /* requests written (SQEs but receives) */
	uint64_t cq_head;
	uint64_t msg_head;
	int woke;            /* the last publish rang the doorbell: message waits do not spin */
};

/* krc_error is the text of c's last failure. */
static inline const char *krc_error(const struct krc_client *c) { return c->err; }

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static inline int krc__fail(struct krc_client *c, int code, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->err, sizeof c->err, fmt, ap);
	va_end(ap);
	c->code = code;
	errno = err;
	return -1;
}

static inline uint64_t krc__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Building a request in c->msg. */
static inline void krc__begin(struct krc_client *c, enum krc_op op)
{
	memset(c->msg, 0, KRC_HEADER_LEN);
	c->msg[0] = (uint8_t)op;
	c->seq++;
	memcpy(c->msg + 8, &c->seq, 8);
	c->n = KRC_HEADER_LEN;
	c->bad = 0;
}

static inline void krc__put(struct krc_client *c, const void *p, size_t k)
{
	if (c->bad || sizeof c->msg - c->n < k) {
		c->bad = 1;
		return;
	}
	memcpy(c->msg + c->n, p, k);
	c->n += k;
}

static inline void krc__u8(struct krc_client *c, uint8_t v) { krc__put(c, &v, 1); }
static inline void krc__u32(struct krc_client *c, uint32_t v) { krc__put(c, &v, 4); }
static inline void krc__u64(struct krc_client *c, uint64_t v) { krc__put(c, &v, 8); }

static inline void krc__str(struct krc_client *c, const char *s)
{
	size_t k = strlen(s);
	if (k > 0xffff) {
		c->bad = 1;
		return;
	}
	uint16_t n = (uint16_t)k;
	krc__put(c, &n, 2);
	krc__put(c, s, k);
}

/* Reading a response in c->msg. */
static inline const uint8_t *krc__take(struct krc_client *c, size_t k)
{
	if (c->bad || c->n - c->off < k) {
		c->bad = 1;
		return NULL;
	}
	const uint8_t *p = c->msg + c->off;
	c->off += k;
	return p;
}

static inline uint32_t krc__get_u32(struct krc_client *c)
{
	uint32_t v = 0;
	const uint8_t *p = krc__take(c, 4);
	if (p)
		memcpy(&v, p, 4);
	return v;
}

static inline uint64_t krc__get_u64(struct krc_client *c)
{
	uint64_t v = 0;
	const uint8_t *p = krc__take(c, 8);
	if (p)
		memcpy(&v, p, 8);
	return v;
}

/* krc__get_str copies a string into out (truncated, NUL-terminated). */
static inline void krc__get_str(struct krc_client *c, char *out, size_t cap)
{
	uint16_t n = 0;
	const uint8_t *p = krc__take(c, 2);
	if (p)
		memcpy(&n, p, 2);
	p = krc__take(c, n);
	size_t k = p ? (n < cap - 1 ? n : cap - 1) : 0;
	if (k)
		memcpy(out, p, k);
	out[k] = 0;
}

static inline int krc__gone(struct krc_client *c, const char *why)
{
	if (!c->gone) {
		c->gone = 1;
		return krc__fail(c, KRC_CODE_CLOSED, EPIPE, "krcored gone: %s", why);
	}
	c->code = KRC_CODE_CLOSED;
	errno = EPIPE;
	return -1;
}

/* krc__recv reads one message into c->msg within ms milliseconds (-1:
 * forever): 1 when it got one, 0 on timeout, -1 when the daemon is gone
 * (its socket closed, or OpBye). Descriptors, which the daemon never sends,
 * are closed. */
static inline int krc__recv(struct krc_client *c, int ms)
{
	for (;;) {
		struct pollfd p = {.fd = c->fd, .events = POLLIN};
		int r = poll(&p, 1, ms);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return krc__gone(c, strerror(errno));
		if (r == 0)
			return 0;
		union {
			char buf[CMSG_SPACE(4 * sizeof(int))];
			struct cmsghdr align;
		} u;
		struct iovec iov = {.iov_base = c->msg, .iov_len = sizeof c->msg};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
				    .msg_controllen = sizeof u.buf};
		ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0)
			return krc__gone(c, strerror(errno));
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
			if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
				size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
				for (size_t i = 0; i < k; i++) {
					int fd;
					memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
					close(fd);
				}
			}
		}
		if (n == 0)
			return krc__gone(c, "connection closed");
		if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || n < KRC_HEADER_LEN)
			continue; /* malformed: not ours to answer */
		c->n = (size_t)n;
		c->off = KRC_HEADER_LEN;
		c->bad = 0;
		if (c->msg[0] == KRC_OP_BYE) {
			char why[256];
			krc__get_str(c, why, sizeof why);
			return krc__gone(c, why);
		}
		return 1;
	}
}

/* krc__call sends the request built in c->msg with nfds descriptors (which
 * stay the caller's) and waits for its response; 0 when it succeeded, with
 * c->off at the response's body. */
static inline int krc__call(struct krc_client *c, const int *fds, int nfds)
{
	int op = c->msg[0];
	uint64_t seq = c->seq;
	if (c->gone)
		return krc__gone(c, "");
	if (c->bad)
		return krc__fail(c, KRC_CODE_INVALID, EINVAL, "op %d: request too long", op);
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof u);
	struct iovec iov = {.iov_base = c->msg, .iov_len = c->n};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds > 0) {
		if (nfds > 4)
			return krc__fail(c, KRC_CODE_INVALID, EINVAL, "op %d: %d descriptors", op, nfds);
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
	}
	ssize_t n;
	do
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return krc__gone(c, strerror(errno));
	uint64_t deadline = krc__now_ns() + (uint64_t)c->timeout_ms * 1000000u;
	for (;;) {
		uint64_t now = krc__now_ns();
		int ms = c->timeout_ms < 0 ? -1 : now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
		int r = krc__recv(c, ms);
		if (r < 0)
			return -1;
		if (r == 0)
			return krc__fail(c, KRC_CODE_DEADLINE, ETIMEDOUT, "op %d: no answer in %d ms", op,
					 c->timeout_ms);
		uint64_t got;
		memcpy(&got, c->msg + 8, 8);
		if (got == seq && c->msg[0] == op)
			break; /* else a late answer to a call that timed out */
	}
	if (c->msg[1] != KRC_CODE_OK) {
		int code = c->msg[1];
		char text[480];
		krc__get_str(c, text, sizeof text);
		return krc__fail(c, code, code == KRC_CODE_DEADLINE ? ETIMEDOUT : EPROTO, "krcored: %s", text);
	}
	return 0;
}

/* krc__body_ok fails a response whose body was too short. */
static inline int krc__body_ok(struct krc_client *c)
{
	if (c->bad)
		return krc__fail(c, KRC_CODE_OTHER, EPROTO, "op %d: malformed response", c->msg[0]);
	return 0;
}

/* krc_default_socket is krcored's default socket:
 * $XDG_RUNTIME_DIR/krcored.sock, else /run/krcored.sock. */
static inline const char *krc_default_socket(char *buf, size_t cap)
{
	const char *d = getenv("XDG_RUNTIME_DIR");
	if (d && *d)
		snprintf(buf, cap, "%s/krcored.sock", d);
	else
		snprintf(buf, cap, "/run/krcored.sock");
	return buf;
}

/* krc_detach closes the socket: the daemon reclaims every VQ, MR and export
 * of the client. Release VQs and MRs first to unmap their memory here. */
static inline void krc_detach(struct krc_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->gone = 1;
}

/* krc_attach connects to krcored at path (NULL: the default socket) and
 * says hello: c learns its id, the node, the credits and the largest
 * message. */
static inline int krc_attach(struct krc_client *c, const char *path)
{
	char def[sizeof(((struct sockaddr_un *)0)->sun_path) + 32];
	memset(c, 0, offsetof(struct krc_client, msg));
	c->fd = -1;
	c->timeout_ms = 10000;
	if (!path)
		path = krc_default_socket(def, sizeof def);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof a.sun_path)
		return krc__fail(c, KRC_CODE_INVALID, ENAMETOOLONG, "attach %s: path too long", path);
	strcpy(a.sun_path, path);
	c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return krc__fail(c, KRC_CODE_OTHER, errno, "socket: %s", strerror(errno));
	if (connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0) {
		int e = errno;
		krc_detach(c);
		return krc__fail(c, KRC_CODE_CLOSED, e, "attach %s: %s", path, strerror(e));
	}
	krc__begin(c, KRC_OP_HELLO);
	krc__u32(c, KRC_VERSION);
	if (krc__call(c, NULL, 0) < 0) {
		int e = errno;
		krc_detach(c);
		errno = e;
		return -1;
	}
	c->id = krc__get_u64(c);
	c->node = krc__get_u64(c);
	c->credits = krc__get_u32(c);
	c->max_msg = krc__get_u32(c);
	if (krc__body_ok(c) < 0) {
		krc_detach(c);
		return -1;
	}
	return 0;
}

/* krc__memfd makes a memfd of size bytes (a whole number of pages), sealed
 * against shrinking and growing as the daemon demands, and maps it. */
static inline int krc__memfd(struct krc_client *c, const char *name, size_t size, int *fd, void **addr)
{
	*fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (*fd < 0)
		return krc__fail(c, KRC_CODE_OTHER, errno, "memfd_create: %s", strerror(errno));
	if (ftruncate(*fd, (off_t)size) < 0 ||
	    fcntl(*fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		int e = errno;
		close(*fd);
		return krc__fail(c, KRC_CODE_OTHER, e, "memfd %s: %s", name, strerror(e));
	}
	*addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (*addr == MAP_FAILED) {
		int e = errno;
		close(*fd);
		return krc__fail(c, KRC_CODE_OTHER, e, "mmap %zu bytes: %s", size, strerror(e));
	}
	return 0;
}

/* krc_register_fd registers len bytes at offset off of a memfd the caller
 * made and sealed against shrinking (F_SEAL_SHRINK), and mapped itself;
 * the fd stays the caller's. */
static inline int krc_register_fd(struct krc_client *c, int memfd, uint64_t off, uint64_t len,
				  uint32_t access, uint64_t *id)
{
	krc__begin(c, KRC_OP_REGISTER);
	krc__u64(c, off);
	krc__u64(c, len);
	krc__u32(c, access);
	if (krc__call(c, &memfd, 1) < 0)
		return -1;
	*id = krc__get_u64(c);
	return krc__body_ok(c);
}

/* krc_reg_mr allocates size bytes of memfd memory and registers them. */
static inline int krc_reg_mr(struct krc_client *c, size_t size, uint32_t access, struct krc_mr *mr)
{
	mr->fd = -1;
	mr->addr = NULL;
	mr->id = 0;
	if (size == 0)
		return krc__fail(c, KRC_CODE_INVALID, EINVAL, "register: size 0");
	void *addr;
	int fd;
	if (krc__memfd(c, "krcore-mr", krc__page_round(size), &fd, &addr) < 0)
		return -1;
	if (krc_register_fd(c, fd, 0, size, access, &mr->id) < 0) {
		int e = errno;
		munmap(addr, krc__page_round(size));
		close(fd);
		errno = e;
		return -1;
	}
	mr->addr = addr;
	mr->len = size;
	mr->fd = fd;
	return 0;
}

/* krc_dereg_mr deregisters an MR from krc_reg_mr and unmaps it here (even
 * when the daemon is gone, which is then no failure). */
static inline int krc_dereg_mr(struct krc_client *c, struct krc_mr *mr)
{
	int r = 0;
	if (!c->gone) {
		krc__begin(c, KRC_OP_DEREGISTER);
		krc__u64(c, mr->id);
		r = krc__call(c, NULL, 0);
		if (r < 0 && c->code == KRC_CODE_CLOSED)
			r = 0;
	}
	if (mr->addr)
		munmap(mr->addr, krc__page_round(mr->len));
	if (mr->fd >= 0)
		close(mr->fd);
	mr->addr = NULL;
	mr->fd = -1;
	return r;
}

static inline void krc__export(struct krc_client *c, const char *name, uint64_t mr, uint64_t off,
			       uint64_t len, uint32_t access)
{
	krc__begin(c, KRC_OP_EXPORT);
	krc__str(c, name);
	krc__u64(c, mr);
	krc__u64(c, off);
	krc__u64(c, len);
	krc__u32(c, access);
}

/* krc_export offers len bytes at off of MR mr to every node under name. */
static inline int krc_export(struct krc_client *c, const char *name, uint64_t mr, uint64_t off,
			     uint64_t len, uint32_t access)
{
	krc__export(c, name, mr, off, len, access);
	return krc__call(c, NULL, 0);
}

/* krc_export_to offers it only to one principal: the process whose VQ on
 * node holds port bound (krc_bind) and asks with krc_vq_region; any other
 * lookup fails with KRC_CODE_NO_REGION. */
static inline int krc_export_to(struct krc_client *c, const char *name, uint64_t mr, uint64_t off,
				uint64_t len, uint32_t access, uint64_t node, uint32_t port)
{
	krc__export(c, name, mr, off, len, access);
	krc__u32(c, 1);
	krc__u64(c, node);
	krc__u32(c, port);
	return krc__call(c, NULL, 0);
}

/* krc_unexport withdraws a name this client exported. */
static inline int krc_unexport(struct krc_client *c, const char *name)
{
	krc__begin(c, KRC_OP_UNEXPORT);
	krc__str(c, name);
	return krc__call(c, NULL, 0);
}

/* krc_region learns the region node exports under name. */
static inline int krc_region(struct krc_client *c, uint64_t node, const char *name, struct krc_region *g)
{
	krc__begin(c, KRC_OP_REGION);
	krc__u64(c, node);
	krc__str(c, name);
	if (krc__call(c, NULL, 0) < 0)
		return -1;
	g->id = krc__get_u64(c);
	g->len = krc__get_u64(c);
	g->access = krc__get_u32(c);
	g->addr = krc__get_u64(c);
	return krc__body_ok(c);
}

/* krc_status copies the daemon's status report (JSON, what krctl prints). */
static inline int krc_status(struct krc_client *c, char *out, size_t cap)
{
	krc__begin(c, KRC_OP_STATUS);
	if (krc__call(c, NULL, 0) < 0)
		return -1;
	krc__get_str(c, out, cap);
	return krc__body_ok(c);
}

/* ---- VQs -------------------------------------------------------------- */

static inline void krc__vq_release(struct krc_vq *q)
{
	if (q->ring.mem)
		munmap(q->ring.mem, q->ring.size);
	q->ring.mem = NULL;
	int *fds[] = {&q->door, &q->cq_bell, &q->msg_bell};
	for (int i = 0; i < 3; i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
}

/* krc_queue makes a VQ: its ring memfd and three eventfds go to the daemon. */
static inline int krc_queue(struct krc_client *c, struct krc_vq *q)
{
	memset(q, 0, sizeof *q);
	q->c = c;
	q->door = q->cq_bell = q->msg_bell = -1;
	q->ring.max_msg = c->max_msg;
	q->ring.size = krc_ring_size(c->max_msg);
	int memfd;
	void *mem;
	if (krc__memfd(c, "krcore-vq", q->ring.size, &memfd, &mem) < 0)
		return -1;
	q->ring.mem = mem;
	int *bells[] = {&q->door, &q->cq_bell, &q->msg_bell};
	for (int i = 0; i < 3; i++) {
		*bells[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (*bells[i] < 0) {
			int e = errno;
			close(memfd);
			krc__vq_release(q);
			return krc__fail(c, KRC_CODE_OTHER, e, "eventfd: %s", strerror(e));
		}
	}
	int fds[4] = {memfd, q->door, q->cq_bell, q->msg_bell};
	krc__begin(c, KRC_OP_QUEUE);
	int r = krc__call(c, fds, 4);
	close(memfd); /* the mapping stays */
	if (r == 0) {
		q->id = krc__get_u64(c);
		r = krc__body_ok(c);
	}
	if (r < 0) {
		int e = errno;
		krc__vq_release(q);
		errno = e;
	}
	return r;
}

static inline int krc__vq_call(struct krc_vq *q, enum krc_op op)
{
	krc__begin(q->c, op);
	krc__u64(q->c, q->id);
	return 0;
}

/* krc_connect points the VQ at node; krc_connect_port at one of its bound
 * ports (for sends to a VQ there that called krc_bind). */
static inline int krc__connect(struct krc_vq *q, uint64_t node, int to_port, uint32_t port)
{
	krc__vq_call(q, KRC_OP_CONNECT);
	krc__u64(q->c, node);
	krc__u8(q->c, (uint8_t)(to_port != 0));
	krc__u32(q->c, port);
	if (krc__call(q->c, NULL, 0) < 0)
		return -1;
	q->node = node;
	return 0;
}

static inline int krc_connect(struct krc_vq *q, uint64_t node) { return krc__connect(q, node, 0, 0); }

static inline int krc_connect_port(struct krc_vq *q, uint64_t node, uint32_t port)
{
	return krc__connect(q, node, 1, port);
}

/* krc_vq_region learns the region the VQ's node exports under name, asking
 * as the port the VQ is bound to (see krc_export_to). */
static inline int krc_vq_region(struct krc_vq *q, const char *name, struct krc_region *g)
{
	krc__vq_call(q, KRC_OP_VQ_REGION);
	krc__str(q->c, name);
	if (krc__call(q->c, NULL, 0) < 0)
		return -1;
	g->id = krc__get_u64(q->c);
	g->len = krc__get_u64(q->c);
	g->access = krc__get_u32(q->c);
	krc__get_u64(q->c); /* the node: the VQ's */
	g->addr = 0;
	return krc__body_ok(q->c);
}

/* krc_bind makes the VQ receive the messages sent to port; they arrive on
 * the message ring (krc_pop_msg). */
static inline int krc_bind(struct krc_vq *q, uint32_t port)
{
	krc__vq_call(q, KRC_OP_BIND);
	krc__u32(q->c, port);
	return krc__call(q->c, NULL, 0);
}

static inline int krc_unbind(struct krc_vq *q)
{
	krc__vq_call(q, KRC_OP_UNBIND);
	return krc__call(q->c, NULL, 0);
}

/* krc_close_vq closes the VQ in the daemon (requests in flight retire
 * unseen) and releases it here, even when the daemon is gone. */
static inline int krc_close_vq(struct krc_vq *q)
{
	int r = 0;
	if (!q->c->gone) {
		krc__vq_call(q, KRC_OP_CLOSE_VQ);
		r = krc__call(q->c, NULL, 0);
		if (r < 0 && q->c->code == KRC_CODE_CLOSED)
			r = 0;
	}
	krc__vq_release(q);
	return r;
}

static inline void krc__ring_bell(int fd)
{
	uint64_t one = 1;
	ssize_t r = write(fd, &one, sizeof one); /* EAGAIN: a wake-up is pending anyway */
	(void)r;
}

/* krc__notify rings bell if the other side sleeps on flag and reports
 * whether it did; call it after publishing (wire.Notify). */
static inline int krc__notify(struct krc_vq *q, int flag, int bell)
{
	if (atomic_load(krc_ring_ctr(&q->ring, flag)) == 0)
		return 0;
	krc__ring_bell(bell);
	return 1;
}

static inline int krc__usable(struct krc_vq *q)
{
	if (!q->ring.mem)
		return krc__fail(q->c, KRC_CODE_CLOSED, EBADF, "queue closed");
	if (q->c->gone)
		return krc__gone(q->c, "");
	return 0;
}

/* krc__room reports whether one more request fits the credits and the
 * submission ring (recv: the ring only). */
static inline int krc__room(struct krc_vq *q, int recv)
{
	const struct krc_ring *r = &q->ring;
	if (q->sq_tail - atomic_load(krc_ring_ctr(r, KRC_CTR_SQ_HEAD)) >= KRC_SQ_ENTRIES)
		return 0;
	return recv || q->pushed - atomic_load(krc_ring_ctr(r, KRC_CTR_RETIRED)) < q->c->credits;
}

static inline int krc__room_req(struct krc_vq *q) { return krc__room(q, 0); }
static inline int krc__cq_ready(struct krc_vq *q)
{
	return atomic_load(krc_ring_ctr(&q->ring, KRC_CTR_CQ_TAIL)) != q->cq_head;
}
static inline int krc__msg_ready(struct krc_vq *q)
{
	return atomic_load(krc_ring_ctr(&q->ring, KRC_CTR_MSG_TAIL)) != q->msg_head;
}

/* krc__wait returns 0 once ready(q) holds (wire.Wait): it polls for
 * KRC_SPIN_NS (a wait for a message not at all when the last publish rang
 * the doorbell: the daemon slept, and a spin would hold the core it needs
 * to wake, as the Go client's VQ.spin), then sets flag, checks again and
 * sleeps on bell and the socket until woken, timeout_ms passes (-1: never)
 * or the daemon goes. */
static inline int krc__wait(struct krc_vq *q, int (*ready)(struct krc_vq *), int flag, int bell,
			    int timeout_ms)
{
	struct krc_client *c = q->c;
	_Atomic uint64_t *f = krc_ring_ctr(&q->ring, flag);
	uint64_t start = krc__now_ns();
	uint64_t deadline = start + (uint64_t)timeout_ms * 1000000u;
	uint64_t spin = flag == KRC_CTR_CLIENT_MSG && q->woke ? 0 : KRC_SPIN_NS;
	for (unsigned i = 0;; i++) {
		if (ready(q))
			return 0;
		if (c->gone)
			return krc__gone(c, "");
		if (i % 16 != 15)
			continue;
		uint64_t now = krc__now_ns();
		if (now - start < spin)
			continue;
		if (timeout_ms >= 0 && now >= deadline)
			return krc__fail(c, KRC_CODE_DEADLINE, ETIMEDOUT, "wait: timed out after %d ms",
					 timeout_ms);
		atomic_store(f, 1);
		if (ready(q)) {
			atomic_store(f, 0);
			return 0;
		}
		struct pollfd p[2] = {{.fd = bell, .events = POLLIN}, {.fd = c->fd, .events = POLLIN}};
		int ms = timeout_ms < 0 ? -1 : (int)((deadline - now + 999999) / 1000000);
		int r = poll(p, 2, ms);
		atomic_store(f, 0);
		if (r < 0 && errno != EINTR)
			return krc__fail(c, KRC_CODE_OTHER, errno, "poll: %s", strerror(errno));
		if (r > 0 && p[0].revents) {
			uint64_t v;
			ssize_t k = read(bell, &v, sizeof v);
			(void)k;
		}
		if (r > 0 && p[1].revents && krc__recv(c, 0) < 0)
			return -1; /* goodbye or closed; else a late answer, dropped */
	}
}

/* krc__put_sqe writes one SQE at the submission tail (not yet published). */
static inline uint64_t krc__put_sqe(struct krc_vq *q, const struct krc_sqe *e)
{
	struct krc_sqe *s = krc_ring_sqe(&q->ring, q->sq_tail);
	memcpy(s, e, sizeof *s);
	s->reserved = 0;
	return q->sq_tail++;
}

/* krc__publish hands the written SQEs to the daemon. */
static inline void krc__publish(struct krc_vq *q)
{
	_Atomic uint64_t *tail = krc_ring_ctr(&q->ring, KRC_CTR_SQ_TAIL);
	if (atomic_load(tail) == q->sq_tail)
		return;
	atomic_store(tail, q->sq_tail);
	q->woke = krc__notify(q, KRC_CTR_DAEMON_SLEEPS, q->door);
}

/* krc_push_n submits up to n requests in order and returns how many fit the
 * credits and the ring (the first has sequence number q->sq_tail as it was
 * before the call, the others follow), or -1. */
static inline int krc_push_n(struct krc_vq *q, const struct krc_sqe *e, int n)
{
	if (krc__usable(q) < 0)
		return -1;
	if (q->node == 0)
		return krc__fail(q->c, KRC_CODE_NOT_CONNECTED, ENOTCONN, "push: queue not connected");
	int k = 0;
	for (; k < n && krc__room(q, 0); k++) {
		krc__put_sqe(q, &e[k]);
		q->pushed++;
	}
	krc__publish(q);
	return k;
}

/* krc_push submits one request and returns its sequence number, which its
 * completion carries; -1 with errno EAGAIN when the VQ has no credit left
 * (pop completions, or use krc_push_wait). */
static inline int64_t krc_push(struct krc_vq *q, const struct krc_sqe *e)
{
	uint64_t seq = q->sq_tail;
	int k = krc_push_n(q, e, 1);
	if (k < 0)
		return -1;
	if (k == 0)
		return krc__fail(q->c, KRC_CODE_BUSY, EAGAIN, "push: %u requests outstanding, no credit",
				 q->c->credits);
	return (int64_t)seq;
}

/* krc_push_wait is krc_push that waits up to timeout_ms (-1: forever) for a
 * credit. Completions keep arriving meanwhile: pop them, or the completion
 * ring fills and credits never return. */
static inline int64_t krc_push_wait(struct krc_vq *q, const struct krc_sqe *e, int timeout_ms)
{
	if (krc__usable(q) < 0)
		return -1;
	if (!krc__room(q, 0) &&
	    krc__wait(q, krc__room_req, KRC_CTR_CLIENT_CQ, q->cq_bell, timeout_ms) < 0)
		return -1;
	return krc_push(q, e);
}

/* krc_push_recv posts a receive buffer (a bound VQ's next message lands in
 * it, KRC_MSG_IN_BUF); it takes no credit. */
static inline int krc_push_recv(struct krc_vq *q, uint64_t mr, uint64_t off, uint64_t len)
{
	if (krc__usable(q) < 0)
		return -1;
	if (!krc__room(q, 1))
		return krc__fail(q->c, KRC_CODE_BUSY, EAGAIN, "push recv: submission ring full");
	struct krc_sqe e = {.op = KRC_OP_RECV, .mr = mr, .off = off, .len = len};
	krc__put_sqe(q, &e);
	krc__publish(q);
	return 0;
}

/* krc_pop moves up to n completions into out, in order; it never blocks. */
static inline int krc_pop(struct krc_vq *q, struct krc_cqe *out, int n)
{
	if (!q->ring.mem)
		return 0;
	const struct krc_ring *r = &q->ring;
	uint64_t tail = atomic_load(krc_ring_ctr(r, KRC_CTR_CQ_TAIL));
	int k = 0;
	for (; k < n && q->cq_head != tail; k++)
		memcpy(&out[k], krc_ring_cqe(r, q->cq_head++), sizeof out[k]);
	if (k > 0) {
		atomic_store(krc_ring_ctr(r, KRC_CTR_CQ_HEAD), q->cq_head);
		if (atomic_load(krc_ring_ctr(r, KRC_CTR_DAEMON_FULL_CQ)) != 0)
			krc__ring_bell(q->door);
	}
	return k;
}

/* krc_pop_wait is krc_pop that waits up to timeout_ms (-1: forever) for at
 * least one completion: it spins briefly, then sleeps on the completion
 * eventfd. It returns the count, or -1 (ETIMEDOUT, or EPIPE when the
 * daemon is gone). */
static inline int krc_pop_wait(struct krc_vq *q, struct krc_cqe *out, int n, int timeout_ms)
{
	for (;;) {
		int k = krc_pop(q, out, n);
		if (k > 0)
			return k;
		if (krc__usable(q) < 0)
			return -1;
		if (krc__wait(q, krc__cq_ready, KRC_CTR_CLIENT_CQ, q->cq_bell, timeout_ms) < 0)
			return -1;
	}
}

/* krc_pop_msg takes the next received message of a bound VQ: 1 with *h
 * filled and up to cap bytes of its data copied to data (none when it
 * landed in a posted buffer, KRC_MSG_IN_BUF, or is a WRITE_WITH_IMM's
 * notification, KRC_MSG_WRITE), or 0 when there is none. */
static inline int krc_pop_msg(struct krc_vq *q, struct krc_msghdr *h, void *data, size_t cap)
{
	if (!q->ring.mem || !krc__msg_ready(q))
		return 0;
	const struct krc_ring *r = &q->ring;
	const struct krc_msghdr *m = krc_ring_msg(r, q->msg_head);
	memcpy(h, m, sizeof *h);
	if (!(h->flags & (KRC_MSG_IN_BUF | KRC_MSG_WRITE))) {
		size_t k = h->len < r->max_msg ? h->len : r->max_msg;
		memcpy(data, (const uint8_t *)m + KRC_MSGHDR_LEN, k < cap ? k : cap);
	}
	atomic_store(krc_ring_ctr(r, KRC_CTR_MSG_HEAD), ++q->msg_head);
	if (atomic_load(krc_ring_ctr(r, KRC_CTR_DAEMON_FULL_MSG)) != 0)
		krc__ring_bell(q->door);
	return 1;
}

/* krc_pop_msg_wait is krc_pop_msg that waits up to timeout_ms (-1: forever)
 * for a message; 1, or -1. */
static inline int krc_pop_msg_wait(struct krc_vq *q, struct krc_msghdr *h, void *data, size_t cap,
				   int timeout_ms)
{
	for (;;) {
		if (krc_pop_msg(q, h, data, cap))
			return 1;
		if (krc__usable(q) < 0)
			return -1;
		if (krc__wait(q, krc__msg_ready, KRC_CTR_CLIENT_MSG, q->msg_bell, timeout_ms) < 0)
			return -1;
	}
}

#endif /* KRCORE_H */
