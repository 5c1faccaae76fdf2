// SPDX-License-Identifier: GPL-2.0
/*
 * Per-sandbox egress control: cgroup socket hooks shared by every sandbox of one dsecd.
 *
 * dsecd loads this object once and attaches its programs to the cgroup2 directory of
 * every sandbox whose network mode is `allow` or `open` (mode `none` sandboxes have no
 * route out and get no programs). Every decision is keyed by the caller's cgroup id
 * (bpf_get_current_cgroup_id(): the inode number of the sandbox's cgroup2 directory),
 * so one program set serves thousands of sandboxes and a policy change is a map write.
 *
 * Maps (pinned by name in the instance's bpffs, so policies survive a dsecd restart):
 *   egress_conf      cgroup id -> struct conf        (mode, resolver address)
 *   egress_counters  cgroup id -> struct counters    (denials, last denied destination)
 *   egress_allow4/6, egress_deny4/6
 *                    LPM tries keyed (cgroup id, address prefix) -> struct portset
 *
 * dsecd compiles a sandbox's rules (daemon/security/egress.ts) so that the longest
 * prefix containing an address carries the union of the ports of every rule containing
 * it; one LPM lookup per trie is then exact. Order of checks, for connect and sendmsg:
 *   1. loopback (127/8, ::1) and the unspecified address (which the kernel routes to
 *      loopback) are always allowed: the sandbox's own loopback;
 *   2. the sandbox's resolver (gateway:53, TCP or UDP) is always allowed;
 *   3. a deny entry whose port set matches denies (deny wins over allow);
 *   4. mode open allows; mode allow allows only on a matching allow entry.
 * IPv4-mapped IPv6 destinations (::ffff:a.b.c.d) are checked against the v4 tries, so a
 * v6 socket cannot reach a denied v4 address. sock_create denies raw sockets and every
 * inet/inet6 protocol other than TCP and UDP (SCTP, ICMP datagram sockets, MPTCP, ...):
 * those would carry traffic these hooks never see.
 *
 * A cgroup with programs but no egress_conf entry is denied everything (fail closed):
 * dsecd writes the entry before it attaches and removes it only after detaching.
 * Returning 0 from these hooks fails the call with EPERM.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif
#ifndef SOCK_STREAM
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#endif

/* Most port ranges one prefix entry carries (after merging): 32, twice the 16 ports one rule may name. */
#define MAX_RANGES 32

#define PROTO_TCP 1
#define PROTO_UDP 2

#define MODE_ALLOW 1
#define MODE_OPEN 2

#define KIND_CONNECT 1
#define KIND_SENDMSG 2
#define KIND_SOCK_CREATE 3

/* A destination port range (host byte order, inclusive) and the protocols (PROTO_*) it covers. */
struct range {
	__u16 lo;
	__u16 hi;
	__u32 protos;
};

/* Value of the LPM tries: `n` ranges in r[0..n). 8 + 32 * 8 = 264 bytes. */
struct portset {
	__u32 n;
	__u32 _pad;
	struct range r[MAX_RANGES];
};

/* LPM key: prefixlen counts bits of (cg, addr); every entry has prefixlen >= 64, so a match is always for the caller's cgroup. */
struct key4 {
	__u32 prefixlen;
	__u32 cg[2];
	__u32 addr;
};

struct key6 {
	__u32 prefixlen;
	__u32 cg[2];
	__u32 addr[4];
};

/* Per-sandbox settings. resolver4 in network byte order. */
struct conf {
	__u32 mode;
	__u32 resolver4;
	__u32 flags;
	__u32 _pad;
};

/* Per-sandbox denial counters and the last denied attempt. 64 bytes. */
struct counters {
	__u64 connect;
	__u64 sendmsg;
	__u64 sock_create;
	__u64 last_ns;
	__u32 last_addr[4];	/* network byte order; v4 in last_addr[0] */
	__u16 last_port;	/* host byte order */
	__u8 last_family;	/* 4, 6, or 0 for sock_create */
	__u8 last_proto;	/* IPPROTO_* */
	__u32 last_kind;	/* KIND_* */
	__u32 last_sock_type;	/* SOCK_* of a denied sock_create */
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct conf);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_conf SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_counters SEC(".maps");

#define LPM_MAP(name, keytype)                                   \
	struct {                                                 \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);             \
		__uint(max_entries, 262144);                     \
		__uint(map_flags, BPF_F_NO_PREALLOC);            \
		__type(key, struct keytype);                     \
		__type(value, struct portset);                   \
		__uint(pinning, LIBBPF_PIN_BY_NAME);             \
	} name SEC(".maps")

LPM_MAP(egress_allow4, key4);
LPM_MAP(egress_deny4, key4);
LPM_MAP(egress_allow6, key6);
LPM_MAP(egress_deny6, key6);

static __always_inline int ps_match(const struct portset *ps, __u16 port, __u32 proto)
{
	__u32 n = ps->n;
	for (int i = 0; i < MAX_RANGES; i++) {
		if (i >= n)
			break;
		const struct range *r = &ps->r[i];
		if ((r->protos & proto) && port >= r->lo && port <= r->hi)
			return 1;
	}
	return 0;
}

static __always_inline __u32 proto_bit(__u32 type, __u32 protocol)
{
	if (protocol == IPPROTO_TCP)
		return PROTO_TCP;
	if (protocol == IPPROTO_UDP)
		return PROTO_UDP;
	if (protocol == 0 && type == SOCK_STREAM)
		return PROTO_TCP;
	if (protocol == 0 && type == SOCK_DGRAM)
		return PROTO_UDP;
	return 0;
}

static __always_inline void count(__u64 cg, __u32 kind, __u8 family, const __u32 *addr, __u16 port, __u8 proto, __u32 sock_type)
{
	struct counters *c = bpf_map_lookup_elem(&egress_counters, &cg);
	if (!c)
		return;
	if (kind == KIND_CONNECT)
		__sync_fetch_and_add(&c->connect, 1);
	else if (kind == KIND_SENDMSG)
		__sync_fetch_and_add(&c->sendmsg, 1);
	else
		__sync_fetch_and_add(&c->sock_create, 1);
	c->last_ns = bpf_ktime_get_ns();
	c->last_kind = kind;
	c->last_family = family;
	c->last_port = port;
	c->last_proto = proto;
	c->last_sock_type = sock_type;
	if (addr) {
		c->last_addr[0] = addr[0];
		c->last_addr[1] = family == 6 ? addr[1] : 0;
		c->last_addr[2] = family == 6 ? addr[2] : 0;
		c->last_addr[3] = family == 6 ? addr[3] : 0;
	}
}

/* 1: allowed, 0: denied. addr in network byte order, port in host byte order. */
static __always_inline int decide4(__u64 cg, const struct conf *cf, __u32 addr, __u16 port, __u32 proto)
{
	__u32 h = bpf_ntohl(addr);
	if ((h >> 24) == 127 || h == 0)
		return 1;
	if (addr == cf->resolver4 && port == 53 && proto)
		return 1;
	if (!proto)
		return 0;
	struct key4 k = { .prefixlen = 96, .addr = addr };
	__builtin_memcpy(k.cg, &cg, sizeof(cg));
	const struct portset *ps = bpf_map_lookup_elem(&egress_deny4, &k);
	if (ps && ps_match(ps, port, proto))
		return 0;
	if (cf->mode == MODE_OPEN)
		return 1;
	ps = bpf_map_lookup_elem(&egress_allow4, &k);
	return ps && ps_match(ps, port, proto);
}

static __always_inline int decide6(__u64 cg, const struct conf *cf, const __u32 *a, __u16 port, __u32 proto)
{
	if (a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff))
		return decide4(cg, cf, a[3], port, proto);
	if (a[0] == 0 && a[1] == 0 && a[2] == 0 && (a[3] == 0 || a[3] == bpf_htonl(1)))
		return 1;
	if (!proto)
		return 0;
	struct key6 k = { .prefixlen = 192 };
	__builtin_memcpy(k.cg, &cg, sizeof(cg));
	k.addr[0] = a[0];
	k.addr[1] = a[1];
	k.addr[2] = a[2];
	k.addr[3] = a[3];
	const struct portset *ps = bpf_map_lookup_elem(&egress_deny6, &k);
	if (ps && ps_match(ps, port, proto))
		return 0;
	if (cf->mode == MODE_OPEN)
		return 1;
	ps = bpf_map_lookup_elem(&egress_allow6, &k);
	return ps && ps_match(ps, port, proto);
}

static __always_inline int check4(struct bpf_sock_addr *ctx, __u32 kind)
{
	__u64 cg = bpf_get_current_cgroup_id();
	const struct conf *cf = bpf_map_lookup_elem(&egress_conf, &cg);
	__u32 addr = ctx->user_ip4;
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	__u32 protocol = ctx->protocol;
	if (cf && decide4(cg, cf, addr, port, proto_bit(ctx->type, protocol)))
		return 1;
	count(cg, kind, 4, &addr, port, (__u8)protocol, 0);
	return 0;
}

static __always_inline int check6(struct bpf_sock_addr *ctx, __u32 kind)
{
	__u64 cg = bpf_get_current_cgroup_id();
	const struct conf *cf = bpf_map_lookup_elem(&egress_conf, &cg);
	__u32 a[4];
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	__u32 protocol = ctx->protocol;
	if (cf && decide6(cg, cf, a, port, proto_bit(ctx->type, protocol)))
		return 1;
	count(cg, kind, 6, a, port, (__u8)protocol, 0);
	return 0;
}

SEC("cgroup/connect4")
int egress_connect4(struct bpf_sock_addr *ctx)
{
	return check4(ctx, KIND_CONNECT);
}

SEC("cgroup/connect6")
int egress_connect6(struct bpf_sock_addr *ctx)
{
	return check6(ctx, KIND_CONNECT);
}

SEC("cgroup/sendmsg4")
int egress_sendmsg4(struct bpf_sock_addr *ctx)
{
	return check4(ctx, KIND_SENDMSG);
}

SEC("cgroup/sendmsg6")
int egress_sendmsg6(struct bpf_sock_addr *ctx)
{
	return check6(ctx, KIND_SENDMSG);
}

SEC("cgroup/sock_create")
int egress_sock_create(struct bpf_sock *sk)
{
	__u64 cg = bpf_get_current_cgroup_id();
	const struct conf *cf = bpf_map_lookup_elem(&egress_conf, &cg);
	__u32 family = sk->family, type = sk->type, protocol = sk->protocol;
	if (family != AF_INET && family != AF_INET6)
		return 1;
	if (cf && ((type == SOCK_STREAM && protocol == IPPROTO_TCP) || (type == SOCK_DGRAM && protocol == IPPROTO_UDP)))
		return 1;
	count(cg, KIND_SOCK_CREATE, 0, 0, 0, (__u8)protocol, type);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
