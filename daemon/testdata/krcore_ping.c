/*
 * krcore_ping: the message path of include/krcore.h, for cshim_test.go.
 *
 *     krcore_ping SOCKET NODE PORT
 *
 * Binds a VQ to port 7, posts a 128-byte receive buffer, exports 64 bytes
 * as "cring" to the process holding PORT on NODE only, connects to PORT on
 * NODE, looks up "gring" there (exported to this node's port 7) as the
 * client (refused) and as the VQ (found), SENDs "ping" and prints the three
 * messages it expects back (the first lands in the posted buffer, the
 * second comes as a copy, the third is a WRITE_WITH_IMM's notification,
 * printed with what was written into "cring").
 */
#include "krcore.h"

#include <inttypes.h>

static int fail(struct krc_client *c, const char *what)
{
	fprintf(stderr, "krcore_ping: %s: %s\n", what, krc_error(c));
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: krcore_ping SOCKET NODE PORT\n");
		return 1;
	}
	uint64_t node = strtoull(argv[2], NULL, 0);
	uint32_t port = (uint32_t)strtoul(argv[3], NULL, 0);
	static struct krc_client c;
	struct krc_mr mr;
	struct krc_vq q;
	if (krc_attach(&c, argv[1]) < 0)
		return fail(&c, "attach");
	if (krc_reg_mr(&c, 256, KRC_ACCESS_LOCAL_WRITE | KRC_ACCESS_REMOTE_WRITE, &mr) < 0)
		return fail(&c, "register");
	if (krc_export_to(&c, "cring", mr.id, 192, 64, KRC_ACCESS_REMOTE_WRITE, node, port) < 0)
		return fail(&c, "export");
	if (krc_queue(&c, &q) < 0)
		return fail(&c, "queue");
	if (krc_bind(&q, 7) < 0)
		return fail(&c, "bind");
	if (krc_push_recv(&q, mr.id, 0, 128) < 0)
		return fail(&c, "push recv");
	if (krc_connect_port(&q, node, port) < 0)
		return fail(&c, "connect");
	struct krc_region g;
	if (krc_region(&c, node, "gring", &g) == 0 || c.code != KRC_CODE_NO_REGION)
		return fail(&c, "gring found by the client, which holds no port");
	if (krc_vq_region(&q, "gring", &g) < 0)
		return fail(&c, "vq region");
	printf("gring len %" PRIu64 " access %u\n", g.len, g.access);
	char *buf = mr.addr;
	memcpy(buf + 128, "ping", 4);
	struct krc_sqe e = {.op = KRC_WR_SEND, .mr = mr.id, .off = 128, .len = 4};
	int64_t seq = krc_push(&q, &e);
	if (seq < 0)
		return fail(&c, "push");
	struct krc_cqe cqe;
	if (krc_pop_wait(&q, &cqe, 1, 5000) < 0)
		return fail(&c, "pop");
	printf("send seq %" PRId64 " cqe %" PRIu64 " %s\n", seq, cqe.seq, krc_status_str(cqe.status));
	for (int i = 0; i < 3; i++) {
		struct krc_msghdr h;
		char data[64] = {0};
		if (krc_pop_msg_wait(&q, &h, data, sizeof data - 1, 5000) < 0)
			return fail(&c, "pop msg");
		if (h.flags & KRC_MSG_IN_BUF)
			memcpy(data, buf, h.len < 63 ? h.len : 63);
		if (h.flags & KRC_MSG_WRITE)
			memcpy(data, buf + 192, h.len < 63 ? h.len : 63);
		printf("msg %d: in_buf=%d imm=%d:%u write=%d from=%" PRIu64 " port=%u %s %.*s\n", i,
		       !!(h.flags & KRC_MSG_IN_BUF), !!(h.flags & KRC_MSG_HAS_IMM), h.imm,
		       !!(h.flags & KRC_MSG_WRITE), h.from, h.port, krc_status_str(h.status), (int)h.len, data);
	}
	if (krc_unbind(&q) < 0 || krc_close_vq(&q) < 0 || krc_dereg_mr(&c, &mr) < 0)
		return fail(&c, "close");
	krc_detach(&c);
	return 0;
}
