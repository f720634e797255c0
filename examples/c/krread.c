/*
 * krread: READ a region another node exports, through krcored, from C.
 *
 *     cc -std=c11 -O2 -Wall -Wextra -I include examples/c/krread.c -o krread
 *     ./krread [-s SOCKET] [-n BYTES] [-r N] [-m MR] NODE NAME
 *
 * It attaches to krcored, registers a buffer, makes a VQ, connects it to
 * NODE, learns the region NAME there, READs its first BYTES (default 64)
 * and prints them up to the first NUL. -m MR names MR id MR as the local
 * buffer instead of its own, to show that the daemon refuses an MR this
 * process does not own (the READ completes with LOC_PROT_ERR). -r N first
 * READs the region N times, with up to the VQ's credits in flight.
 *
 * Exit status: 0 done, 1 a call failed, 2 the READ completed with an error.
 */
#include "krcore.h"

#include <ctype.h>
#include <inttypes.h>

static int fail(struct krc_client *c, const char *what)
{
	fprintf(stderr, "krread: %s: %s\n", what, krc_error(c));
	return 1;
}

int main(int argc, char **argv)
{
	const char *sock = NULL;
	uint64_t want = 64, foreign = 0, repeat = 0;
	int opt;
	while ((opt = getopt(argc, argv, "s:n:r:m:")) != -1) {
		switch (opt) {
		case 's':
			sock = optarg;
			break;
		case 'n':
			want = strtoull(optarg, NULL, 0);
			break;
		case 'r':
			repeat = strtoull(optarg, NULL, 0);
			break;
		case 'm':
			foreign = strtoull(optarg, NULL, 0);
			break;
		default:
			goto usage;
		}
	}
	if (argc - optind != 2 || want == 0)
		goto usage;
	uint64_t node = strtoull(argv[optind], NULL, 0);
	const char *name = argv[optind + 1];

	static struct krc_client c; /* static: it holds a 64 KiB message buffer */
	if (krc_attach(&c, sock) < 0)
		return fail(&c, "attach");
	printf("attached to krcored as client %" PRIu64 " on node %" PRIu64 " (%u credits)\n", c.id,
	       c.node, c.credits);

	struct krc_mr mr;
	if (krc_reg_mr(&c, (size_t)want, KRC_ACCESS_LOCAL_WRITE, &mr) < 0)
		return fail(&c, "register");
	struct krc_vq q;
	if (krc_queue(&c, &q) < 0)
		return fail(&c, "queue");
	if (krc_connect(&q, node) < 0)
		return fail(&c, "connect");
	struct krc_region g;
	if (krc_region(&c, node, name, &g) < 0)
		return fail(&c, "region");
	uint64_t n = want < g.len ? want : g.len;

	struct krc_sqe e = {.op = KRC_WR_READ, .mr = foreign ? foreign : mr.id, .off = 0, .len = n,
			    .region = g.id, .remote_off = 0};
	struct krc_cqe cqe;
	uint64_t done = 0, pushed = 0;
	while (done < repeat) { /* a stream of READs: push while credits last, then pop */
		if (pushed < repeat && krc_push(&q, &e) >= 0) {
			pushed++;
			continue;
		}
		if (pushed < repeat && errno != EAGAIN)
			return fail(&c, "push");
		struct krc_cqe got[64];
		int k = krc_pop_wait(&q, got, 64, 5000);
		if (k < 0)
			return fail(&c, "pop");
		for (int i = 0; i < k; i++, done++)
			if (got[i].status != KRC_WC_SUCCESS) {
				fprintf(stderr, "krread: READ %" PRIu64 ": %s\n", got[i].seq,
					krc_status_str(got[i].status));
				return 2;
			}
	}
	if (repeat)
		printf("%" PRIu64 " READs done\n", done);

	int64_t seq = krc_push(&q, &e);
	if (seq < 0)
		return fail(&c, "push");
	if (krc_pop_wait(&q, &cqe, 1, 5000) < 0)
		return fail(&c, "pop");
	if (cqe.seq != (uint64_t)seq || cqe.status != KRC_WC_SUCCESS) {
		fprintf(stderr, "krread: READ %" PRIu64 " of %" PRIu64 " bytes from MR %" PRIu64 ": %s\n",
			cqe.seq, n, e.mr, krc_status_str(cqe.status));
		return 2;
	}

	const char *b = mr.addr;
	printf("node %" PRIu64 " region \"%s\" (%" PRIu64 " bytes), read %u: ", node, name, g.len,
	       cqe.len);
	for (uint32_t i = 0; i < cqe.len && b[i]; i++)
		putchar(isprint((unsigned char)b[i]) ? b[i] : '.');
	putchar('\n');

	if (krc_close_vq(&q) < 0 || krc_dereg_mr(&c, &mr) < 0)
		return fail(&c, "close");
	krc_detach(&c);
	return 0;

usage:
	fprintf(stderr, "usage: krread [-s SOCKET] [-n BYTES] [-r N] [-m MR] NODE NAME\n");
	return 1;
}
