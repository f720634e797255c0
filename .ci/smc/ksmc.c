/* ksmc.c: the kernel side of .ci/smc-vm.sh. Drives the Linux kernel's own
 * SMC-R (AF_SMC sockets) and reports what the kernel chose, so that the
 * harness can check it. Built static by the harness:
 *   gcc -O2 -static -pthread -o ksmc ksmc.c
 *
 *   ksmc ueid-add NAME          add a user EID (SMC-Rv2 is offered only with one)
 *   ksmc serve [-t] [-p] [-n N] PORT
 *                               echo server, AF_SMC (AF_INET with -t), N connections,
 *                               one at a time (each in its own process with -p)
 *   ksmc echo [-t] IP PORT BYTES PINGS
 *                               client: BYTES echoed and checked, then PINGS 8 B
 *                               round trips; prints the socket's smc_diag line
 *   ksmc diag                   every AF_SMC socket (smc_diag), one line each
 *   ksmc lgrs                   how many SMC-R link groups the kernel holds
 *
 * Lines meant for the harness start with a keyword and carry key=value
 * fields: "diag ... mode=SMCR fallback=0x..." (smc_diag), "bulk bytes=
 * ms= corrupt=", "pingpong n= rtt_us=", "connect ms=".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/genetlink.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>

#ifndef AF_SMC
#define AF_SMC 43
#endif

/* The parts of include/uapi/linux/smc_diag.h and smc.h this tool reads;
 * declared here because smc_diag.h pulls in rdma headers libc lacks. */
struct smc_diag_req {
	uint8_t diag_family, pad[2], diag_ext;
	struct inet_diag_sockid id;
};
struct smc_diag_msg {
	uint8_t diag_family, diag_state, diag_mode, diag_shutdown;
	struct inet_diag_sockid id;
	uint32_t diag_uid;
	uint64_t diag_inode __attribute__((aligned(8)));
};
enum { DIAG_CONNINFO = 1, DIAG_LGRINFO = 2, DIAG_FALLBACK = 5 };
struct smc_diag_lgrinfo {
	uint8_t link_id, ibname[64], ibport, gid[40], peer_gid[40];
	uint8_t role;
};
#define SMC_GENL_NAME "SMC_GEN_NETLINK"
#define SMC_NETLINK_GET_LGR_SMCR 2
#define SMC_NETLINK_ADD_UEID 10
#define SMC_NLA_EID_TABLE_ENTRY 1
#define SMC_MAX_EID_LEN 32

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void die(const char *what)
{
	fprintf(stderr, "ksmc: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* ---- smc_diag ---------------------------------------------------------- */

static const char *mode_name(int m)
{
	return m == 0 ? "SMCR" : m == 1 ? "TCP" : m == 2 ? "SMCD" : "?";
}

static void print_attrs(struct nlmsghdr *h, struct smc_diag_msg *m)
{
	int left = h->nlmsg_len - NLMSG_LENGTH(sizeof(*m));
	struct nlattr *a = (struct nlattr *)((char *)m + NLMSG_ALIGN(sizeof(*m)));
	for (; left >= (int)NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= left;
	     left -= NLA_ALIGN(a->nla_len), a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len))) {
		void *p = (char *)a + NLA_HDRLEN;
		if (a->nla_type == DIAG_FALLBACK) {
			uint32_t *f = p;
			printf(" fallback=0x%08x peer_diag=0x%08x", f[0], f[1]);
		} else if (a->nla_type == DIAG_LGRINFO) {
			struct smc_diag_lgrinfo *l = p;
			printf(" dev=%s role=%s gid=%s peer_gid=%s", l->ibname, l->role ? "server" : "client",
			       l->gid, l->peer_gid);
		} else if (a->nla_type == DIAG_CONNINFO) {
			uint32_t *c = p; /* token, sndbuf, rmbe, peer_rmbe */
			printf(" token=%u sndbuf=%u rmbe=%u peer_rmbe=%u", c[0], c[1], c[2], c[3]);
		}
	}
}

/* diag prints one line per AF_SMC socket (ino 0) or for the socket with
 * inode ino; returns how many it printed, -1 when smc_diag answered an
 * error. */
static int diag(uint64_t ino, const char *tag)
{
	int fd = socket(AF_NETLINK, SOCK_DGRAM, NETLINK_SOCK_DIAG), n = 0;
	if (fd < 0) die("netlink socket");
	struct { struct nlmsghdr h; struct smc_diag_req r; } q = {0};
	q.h.nlmsg_len = sizeof(q);
	q.h.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	q.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	q.r.diag_family = AF_SMC;
	q.r.diag_ext = 1 << (DIAG_CONNINFO - 1) | 1 << (DIAG_LGRINFO - 1);
	if (send(fd, &q, sizeof(q), 0) < 0) die("smc_diag request");
	static char buf[1 << 16];
	for (;;) {
		int len = recv(fd, buf, sizeof(buf), 0);
		if (len <= 0) break;
		for (struct nlmsghdr *h = (void *)buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
			if (h->nlmsg_type == NLMSG_DONE) goto done;
			if (h->nlmsg_type == NLMSG_ERROR) {
				printf("diag %s error=%d\n", tag, ((struct nlmsgerr *)NLMSG_DATA(h))->error);
				n = -1;
				goto done;
			}
			struct smc_diag_msg *m = NLMSG_DATA(h);
			if (ino && m->diag_inode != ino) continue;
			char s[INET_ADDRSTRLEN], d[INET_ADDRSTRLEN];
			inet_ntop(AF_INET, m->id.idiag_src, s, sizeof(s));
			inet_ntop(AF_INET, m->id.idiag_dst, d, sizeof(d));
			printf("diag %s %s:%u->%s:%u state=%u mode=%s", tag, s, ntohs(m->id.idiag_sport), d,
			       ntohs(m->id.idiag_dport), m->diag_state, mode_name(m->diag_mode));
			print_attrs(h, m);
			printf("\n");
			n++;
		}
	}
done:
	close(fd);
	if (ino && n == 0) printf("diag %s missing inode=%llu\n", tag, (unsigned long long)ino);
	return n;
}

static void diag_fd(int fd, const char *tag)
{
	struct stat st;
	if (fstat(fd, &st) == 0) diag(st.st_ino, tag);
}

/* ---- the UEID, through SMC's generic netlink family ---------------------- */

struct genl_req {
	struct nlmsghdr h;
	struct genlmsghdr g;
	char attrs[256];
};

static void add_attr(struct genl_req *r, int type, const void *v, int len)
{
	struct nlattr *a = (void *)((char *)r + NLMSG_ALIGN(r->h.nlmsg_len));
	a->nla_type = type;
	a->nla_len = NLA_HDRLEN + len;
	memcpy((char *)a + NLA_HDRLEN, v, len);
	r->h.nlmsg_len = NLMSG_ALIGN(r->h.nlmsg_len) + NLA_ALIGN(a->nla_len);
}

/* genl_call sends r and returns the kernel's answer: 0 or -errno, with the
 * family id in *family when the answer carries one. */
static int genl_call(int fd, struct genl_req *r, int *family)
{
	static char buf[8192];
	if (send(fd, r, r->h.nlmsg_len, 0) < 0) die("genetlink send");
	int len = recv(fd, buf, sizeof(buf), 0);
	if (len < 0) die("genetlink recv");
	for (struct nlmsghdr *h = (void *)buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
		if (h->nlmsg_type == NLMSG_ERROR) return ((struct nlmsgerr *)NLMSG_DATA(h))->error;
		int left = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);
		struct nlattr *a = (void *)((char *)NLMSG_DATA(h) + GENL_HDRLEN);
		for (; left >= (int)NLA_HDRLEN && a->nla_len <= left;
		     left -= NLA_ALIGN(a->nla_len), a = (void *)((char *)a + NLA_ALIGN(a->nla_len)))
			if (family && a->nla_type == CTRL_ATTR_FAMILY_ID)
				*family = *(uint16_t *)((char *)a + NLA_HDRLEN);
	}
	return 0;
}

static void genl_init(struct genl_req *r, int type, int cmd)
{
	memset(r, 0, sizeof(*r));
	r->h.nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN);
	r->h.nlmsg_type = type;
	r->h.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
	r->g.cmd = cmd;
	r->g.version = 1;
}

/* smc_family returns the id of SMC's generic netlink family on fd. */
static int smc_family(int fd)
{
	struct genl_req r;
	int family = -1;
	genl_init(&r, GENL_ID_CTRL, CTRL_CMD_GETFAMILY);
	add_attr(&r, CTRL_ATTR_FAMILY_NAME, SMC_GENL_NAME, sizeof(SMC_GENL_NAME));
	int rc = genl_call(fd, &r, &family);
	if (family < 0) {
		fprintf(stderr, "ksmc: no %s family (rc %d): is smc.ko loaded?\n", SMC_GENL_NAME, rc);
		exit(1);
	}
	return family;
}

static int ueid_add(const char *name)
{
	int fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_GENERIC);
	if (fd < 0) die("genetlink socket");
	struct genl_req r;
	int family = smc_family(fd);
	/* The kernel takes the EID blank-padded to 32 characters. */
	char eid[SMC_MAX_EID_LEN + 1];
	memset(eid, ' ', SMC_MAX_EID_LEN);
	eid[SMC_MAX_EID_LEN] = 0;
	memcpy(eid, name, strnlen(name, SMC_MAX_EID_LEN));
	genl_init(&r, family, SMC_NETLINK_ADD_UEID);
	add_attr(&r, SMC_NLA_EID_TABLE_ENTRY, eid, sizeof(eid));
	int rc = genl_call(fd, &r, NULL);
	close(fd);
	if (rc) {
		fprintf(stderr, "ksmc: ueid-add %s: %s\n", name, strerror(-rc));
		return 1;
	}
	printf("ueid added=\"%s\"\n", eid);
	return 0;
}

/* lgrs prints how many SMC-R link groups the kernel has (one message per
 * link group in the SMC_NETLINK_GET_LGR_SMCR dump). */
static int lgrs(void)
{
	int fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_GENERIC), n = 0;
	if (fd < 0) die("genetlink socket");
	struct genl_req r;
	genl_init(&r, smc_family(fd), SMC_NETLINK_GET_LGR_SMCR);
	r.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	if (send(fd, &r, r.h.nlmsg_len, 0) < 0) die("genetlink send");
	static char buf[1 << 16];
	for (;;) {
		int len = recv(fd, buf, sizeof(buf), 0);
		if (len <= 0) die("genetlink recv");
		for (struct nlmsghdr *h = (void *)buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
			if (h->nlmsg_type == NLMSG_DONE) goto done;
			if (h->nlmsg_type == NLMSG_ERROR && ((struct nlmsgerr *)NLMSG_DATA(h))->error == 0)
				continue; /* the family lookup's late ACK */
			if (h->nlmsg_type == NLMSG_ERROR) {
				fprintf(stderr, "ksmc: link group dump: %s\n",
					strerror(-((struct nlmsgerr *)NLMSG_DATA(h))->error));
				return 1;
			}
			n++;
		}
	}
done:
	close(fd);
	printf("lgrs smcr=%d\n", n);
	return 0;
}

/* ---- echo server and client --------------------------------------------- */

static int stream_socket(int tcp)
{
	int fd = tcp ? socket(AF_INET, SOCK_STREAM, 0) : socket(AF_SMC, SOCK_STREAM, 0);
	if (fd < 0) die(tcp ? "socket AF_INET" : "socket AF_SMC");
	return fd;
}

static void no_delay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w <= 0) return -1;
		p += w;
		n -= w;
	}
	return 0;
}

static void echo_conn(int c, int tcp)
{
	static char b[1 << 16];
	no_delay(c);
	if (!tcp) diag_fd(c, "server");
	long long total = 0;
	ssize_t n;
	while ((n = read(c, b, sizeof(b))) > 0 && write_all(c, b, n) == 0) total += n;
	printf("serve done echoed=%lld\n", total);
	close(c);
}

static int serve(int tcp, int par, int conns, int port)
{
	int l = stream_socket(tcp), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(l, (void *)&a, sizeof(a)) || listen(l, 16)) die("bind/listen");
	printf("serve listening port=%d family=%s\n", port, tcp ? "AF_INET" : "AF_SMC");
	int kids = 0;
	for (int i = 0; conns <= 0 || i < conns; i++) {
		int c = accept(l, NULL, NULL);
		if (c < 0) die("accept");
		if (!par) {
			echo_conn(c, tcp);
			continue;
		}
		pid_t pid = fork();
		if (pid < 0) die("fork");
		if (pid == 0) {
			close(l);
			echo_conn(c, tcp);
			exit(0);
		}
		close(c);
		kids++;
	}
	close(l);
	while (kids-- > 0) wait(NULL);
	return 0;
}

struct writer_arg {
	int fd;
	size_t n;
};

static char pattern(size_t i)
{
	return (char)(i * 131 + 7);
}

static void *writer(void *p)
{
	struct writer_arg *w = p;
	static char b[1 << 16];
	for (size_t off = 0; off < w->n;) {
		size_t k = w->n - off < sizeof(b) ? w->n - off : sizeof(b);
		for (size_t i = 0; i < k; i++) b[i] = pattern(off + i);
		if (write_all(w->fd, b, k)) die("bulk write");
		off += k;
	}
	return NULL;
}

static void bulk(int fd, size_t n)
{
	pthread_t t;
	struct writer_arg w = {fd, n};
	static char b[1 << 16];
	size_t got = 0, bad = 0;
	double t0 = now_ms();
	pthread_create(&t, NULL, writer, &w);
	while (got < n) {
		ssize_t r = read(fd, b, sizeof(b));
		if (r <= 0) {
			fprintf(stderr, "ksmc: bulk read ended after %zu of %zu bytes\n", got, n);
			exit(1);
		}
		for (ssize_t i = 0; i < r; i++) bad += b[i] != pattern(got + i);
		got += r;
	}
	pthread_join(t, NULL);
	printf("bulk bytes=%zu ms=%.1f corrupt=%zu\n", got, now_ms() - t0, bad);
	if (bad) exit(1);
}

static void pingpong(int fd, int n)
{
	char b[8] = "ksmcping";
	double t0 = 0;
	if (n <= 0) return;
	for (int i = -10; i < n; i++) { /* 10 rounds to warm up */
		if (i == 0) t0 = now_ms();
		if (write_all(fd, b, 8)) die("ping write");
		for (int g = 0; g < 8;) {
			ssize_t r = read(fd, b + g, 8 - g);
			if (r <= 0) die("ping read");
			g += r;
		}
	}
	printf("pingpong n=%d rtt_us=%.1f\n", n, (now_ms() - t0) * 1e3 / n);
}

static int echo_client(int tcp, const char *ip, int port, size_t bytes, int pings)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
		fprintf(stderr, "ksmc: bad address %s\n", ip);
		return 2;
	}
	int fd = stream_socket(tcp);
	double t0 = now_ms();
	/* The server may still be starting (an emulated VM): retry refusals. */
	for (int tries = 0; connect(fd, (void *)&a, sizeof(a)); tries++) {
		if (errno != ECONNREFUSED || tries == 50) die("connect");
		close(fd);
		usleep(100000);
		fd = stream_socket(tcp);
		t0 = now_ms();
	}
	printf("connect ms=%.1f family=%s\n", now_ms() - t0, tcp ? "AF_INET" : "AF_SMC");
	no_delay(fd);
	if (!tcp) diag_fd(fd, "client");
	if (bytes) bulk(fd, bytes);
	pingpong(fd, pings);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	int tcp = 0, par = 0, conns = 0, i = 2;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "-t")) tcp = 1;
		else if (!strcmp(argv[i], "-p")) par = 1;
		else if (!strcmp(argv[i], "-n") && i + 1 < argc) conns = atoi(argv[++i]);
		else goto usage;
	}
	const char *cmd = argc > 1 ? argv[1] : "";
	int rest = argc - i;
	if (!strcmp(cmd, "ueid-add") && rest == 1) return ueid_add(argv[i]);
	if (!strcmp(cmd, "serve") && rest == 1) return serve(tcp, par, conns, atoi(argv[i]));
	if (!strcmp(cmd, "echo") && rest == 4)
		return echo_client(tcp, argv[i], atoi(argv[i + 1]), strtoul(argv[i + 2], NULL, 0), atoi(argv[i + 3]));
	if (!strcmp(cmd, "diag") && rest == 0) return diag(0, "all") < 0;
	if (!strcmp(cmd, "lgrs") && rest == 0) return lgrs();
usage:
	fprintf(stderr, "usage: ksmc ueid-add NAME | serve [-t] [-p] [-n N] PORT | echo [-t] IP PORT BYTES PINGS | diag | lgrs\n");
	return 2;
}
