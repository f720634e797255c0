/*
 * krcore_check: prints include/krcore.h's view of the protocol, for
 * cshim_test.go to compare with package wire's.
 *
 *     krcore_check                 constants and layouts, "NAME VALUE" lines
 *     krcore_check FILE MAXMSG     also reads the ring Go wrote into FILE
 *                                  (SQE 5, CQE 7, message 3, counters) and
 *                                  writes SQE 9 for Go to read back
 */
#include "krcore.h"

#include <inttypes.h>

#define P(name, v) printf("%s %" PRIu64 "\n", name, (uint64_t)(v))
#define C(x) P(#x, x)

int main(int argc, char **argv)
{
	C(KRC_VERSION);
	C(KRC_HEADER_LEN);
	C(KRC_MAX_MESSAGE);
	C(KRC_SPIN_NS);
	C(KRC_OP_HELLO);
	C(KRC_OP_REGISTER);
	C(KRC_OP_DEREGISTER);
	C(KRC_OP_EXPORT);
	C(KRC_OP_UNEXPORT);
	C(KRC_OP_REGION);
	C(KRC_OP_QUEUE);
	C(KRC_OP_CONNECT);
	C(KRC_OP_BIND);
	C(KRC_OP_UNBIND);
	C(KRC_OP_CLOSE_VQ);
	C(KRC_OP_STATS);
	C(KRC_OP_STATUS);
	C(KRC_OP_BYE);
	C(KRC_OP_VQ_REGION);
	C(KRC_CODE_OK);
	C(KRC_CODE_OTHER);
	C(KRC_CODE_CLOSED);
	C(KRC_CODE_NOT_CONNECTED);
	C(KRC_CODE_PORT_IN_USE);
	C(KRC_CODE_NO_REGION);
	C(KRC_CODE_UNREACHABLE);
	C(KRC_CODE_REFUSED);
	C(KRC_CODE_INVALID);
	C(KRC_CODE_BUSY);
	C(KRC_CODE_DEADLINE);
	C(KRC_CODE_LIMIT);
	C(KRC_CODE_CANCELED);
	C(KRC_SQ_ENTRIES);
	C(KRC_CQ_ENTRIES);
	C(KRC_MSG_ENTRIES);
	C(KRC_SQE_LEN);
	C(KRC_CQE_LEN);
	C(KRC_MSGHDR_LEN);
	C(KRC_CTR_SQ_TAIL);
	C(KRC_CTR_SQ_HEAD);
	C(KRC_CTR_CQ_TAIL);
	C(KRC_CTR_CQ_HEAD);
	C(KRC_CTR_RETIRED);
	C(KRC_CTR_MSG_TAIL);
	C(KRC_CTR_MSG_HEAD);
	C(KRC_CTR_DAEMON_SLEEPS);
	C(KRC_CTR_DAEMON_FULL_CQ);
	C(KRC_CTR_DAEMON_FULL_MSG);
	C(KRC_CTR_CLIENT_CQ);
	C(KRC_CTR_CLIENT_MSG);
	C(KRC_OP_RECV);
	C(KRC_SQE_UNSIGNALED);
	C(KRC_MSG_IN_BUF);
	C(KRC_MSG_HAS_IMM);
	C(KRC_MSG_WRITE);
	C(KRC_WR_SEND);
	C(KRC_WR_SEND_IMM);
	C(KRC_WR_WRITE);
	C(KRC_WR_WRITE_IMM);
	C(KRC_WR_READ);
	C(KRC_WR_COMPARE_SWAP);
	C(KRC_WR_FETCH_ADD);
	C(KRC_ACCESS_LOCAL_WRITE);
	C(KRC_ACCESS_REMOTE_WRITE);
	C(KRC_ACCESS_REMOTE_READ);
	C(KRC_ACCESS_REMOTE_ATOMIC);
	C(KRC_ACCESS_ALL);
	C(KRC_WC_SUCCESS);
	C(KRC_WC_LOC_PROT_ERR);
	C(KRC_WC_WR_FLUSH_ERR);
	C(KRC_WC_REM_ACCESS_ERR);
	C(KRC_WC_GENERAL_ERR);
	for (uint32_t s = 0; s <= KRC_WC_GENERAL_ERR; s++)
		printf("status.%u %s\n", s, krc_status_str(s));
	P("sizeof.sqe", sizeof(struct krc_sqe));
	P("sizeof.cqe", sizeof(struct krc_cqe));
	P("sizeof.msghdr", sizeof(struct krc_msghdr));
	P("ring_size.0", krc_ring_size(0));
	P("ring_size.4000", krc_ring_size(4000));
	P("ring_size.65536", krc_ring_size(65536));
	if (argc < 3)
		return 0;

	uint32_t max_msg = (uint32_t)strtoul(argv[2], NULL, 0);
	int fd = open(argv[1], O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	struct krc_ring r = {.size = krc_ring_size(max_msg), .max_msg = max_msg};
	r.mem = mmap(NULL, r.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r.mem == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	for (int i = 0; i < KRC_CTR_COUNT; i++) {
		char name[32];
		snprintf(name, sizeof name, "ctr.%d", i);
		P(name, atomic_load(krc_ring_ctr(&r, i)));
	}
	const struct krc_sqe *s = krc_ring_sqe(&r, 5 + KRC_SQ_ENTRIES); /* wraps to slot 5 */
	P("sqe.op", s->op);
	P("sqe.flags", s->flags);
	P("sqe.imm", s->imm);
	P("sqe.mr", s->mr);
	P("sqe.off", s->off);
	P("sqe.len", s->len);
	P("sqe.region", s->region);
	P("sqe.remote_off", s->remote_off);
	P("sqe.compare", s->compare);
	P("sqe.swap", s->swap);
	const struct krc_cqe *e = krc_ring_cqe(&r, 7);
	P("cqe.seq", e->seq);
	P("cqe.status", e->status);
	P("cqe.len", e->len);
	const struct krc_msghdr *m = krc_ring_msg(&r, 3);
	P("msg.flags", m->flags);
	P("msg.status", m->status);
	P("msg.len", m->len);
	P("msg.imm", m->imm);
	P("msg.from", m->from);
	P("msg.port", m->port);
	printf("msg.data %.*s\n", (int)m->len, (const char *)m + KRC_MSGHDR_LEN);

	struct krc_sqe w = {.op = KRC_WR_FETCH_ADD, .flags = KRC_SQE_UNSIGNALED, .imm = 0x01020304,
			    .mr = 11, .off = 12, .len = 13, .region = 14, .remote_off = 15,
			    .compare = 0x1111222233334444u, .swap = 0x5555666677778888u};
	memcpy(krc_ring_sqe(&r, 9), &w, sizeof w);
	atomic_store(krc_ring_ctr(&r, KRC_CTR_SQ_TAIL), 10);
	munmap(r.mem, r.size);
	close(fd);
	return 0;
}
