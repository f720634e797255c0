// Package meta is krcore's MetaServer and its client: the directory that
// maps a node id to the node's DC target (fabric address, DCT number, DC
// access key) and control QP, read with one-sided RDMA so that connecting to
// a node costs one READ instead of an RPC.
//
// # Table
//
// A Server keeps every record in one registered memory region laid out as
// a hash table: Buckets buckets of Slots fixed-size slots. A node's record
// lives in bucket bucketOf(node) = hi64(splitmix64(node) * Buckets), in any
// of its slots. A lookup is exactly one RDMA READ of the whole bucket
// (Slots*128 bytes, 512 by default) followed by a scan in local memory;
// KRCore's artifact needs two READs and a linear scan. The client learns
// the region's address and rkey, the geometry and the DCT through which it
// may READ (nothing else) from the server's Hello reply.
//
// # Without DC
//
// On a device without DC (kernel soft-RoCE, rxe), or with
// ServerConfig.NoDC, the server has no DCT and its Hello reply says so (DCT
// number 0). A client without DC (or with ClientConfig.RCReads, or facing
// such a server) then READs over RC: before its first READ it sends a
// connect request over UD carrying its new RC QP; the server creates an RC
// QP that allows remote READ and nothing else, connects it to the client's
// and answers with its number; the client connects its end and keeps the
// pair. Every lookup after that is one READ, as over DC. The server keeps
// ServerConfig.MaxReaders such QPs, one per client, closing the oldest past
// it; a client whose READ then fails connects again once and retries.
//
// Each slot is 128 bytes, little-endian:
//
//	off size field
//	  0    8 version: table-wide counter, new on every write of the slot
//	  8    8 node id (0: empty slot)
//	 16    8 DC access key
//	 24    4 DCT number
//	 28    2 LID
//	 30    1 address length (<= 47)
//	 31    1 reserved (0)
//	 32   16 GID
//	 48   47 fabric address; 95 reserved
//	 96    4 control UD QPN (0: none)
//	100    4 control QKey
//	104   20 reserved (0)
//	124    4 CRC32-C (Castagnoli) of bytes 0..123
//
// # Versions and torn reads
//
// Only the server's loop goroutine writes the table, one whole encoded slot
// at a time; an empty slot is written as an intact slot with node 0. A READ
// may still copy a slot while the server rewrites it: it then holds parts
// of two versions, and the CRC no longer matches. The client checks the CRC
// of the slot holding its node (or, if none holds it, of every slot, since
// a torn slot may have been the node's) and READs the bucket again. A slot
// stays torn for as long as the writer is off the CPU in the middle of its
// copy, which on a loaded machine is milliseconds, not the nanoseconds of
// the copy: so the client READs again at once a few times, then pausing
// (doubling from 10us to 1ms) so the writer can run, until the slot is
// whole or ClientConfig.TornWait (default the READ timeout) has passed,
// when it fails with ErrTorn. A budget of READs back to back would not do:
// 17 of them take tens of microseconds and failed joins under load. Versions
// never repeat on a server, so Record.Version tells a refetched record from
// a cached one. A record is updated in place and never moves while it
// lives, so a lookup concurrent with a renewal always finds it.
//
// # Requests
//
// Registration is two-sided, over UD to the server's request QP (Info).
// Every message starts with a 4-byte header (magic "KM", protocol version
// 1, operation; replies set bit 0x80 of the operation). A request is:
//
//	off size field
//	  0    4 header: magic 0x4d4b, version, op (1 hello, 2 register,
//	         3 renew, 4 deregister, 5 connect)
//	  4    4 reply QPN (the client's UD QP)
//	  8    8 request id
//	 16    8 node id
//	 24    8 lease in nanoseconds (0: the server's default)
//	 32    2 reply LID
//	 34    1 reply address length n (0 on RoCE/IB: the GID or LID names the port)
//	 35    1 reserved
//	 36    4 connect: the client's RC QPN (reserved otherwise)
//	 40    4 connect: its first PSN (reserved otherwise)
//	 44    4 reserved
//	 48   16 reply GID
//	 64  128 record, encoded as a slot (register; zero otherwise)
//	192    n reply address
//
// A UD receive names the sender's QP but not its node, so a request carries
// its reply address. The 96-byte reply carries the status (0 ok, 1 not
// found, 2 table full, 3 invalid), request id, node, the record's version,
// the lease granted, and for hello the geometry: table address, rkey,
// buckets, slots, slot size, DCT number, DC key, server epoch and longest
// lease; for connect, where hello has the table address, the server's RC
// QPN (offset 40) and first PSN (44). A connect names the client by a
// random id in the node field (a client need not be a node). The server drops bytes that do not frame as a request (wrong
// magic, version, op or lengths) without answering; a well-framed request
// that makes no sense (node 0, address too long) is answered "invalid".
//
// UD may drop a datagram, so the client retries a request with a doubling
// timeout (ClientConfig.RequestTimeout, Attempts; package udrpc carries the
// exchange, as it carries runtimes' control messages). Every copy carries the
// same request id; the server remembers each node's last id and reply for
// ServerConfig.DedupWindow and answers a copy with the first reply, so a
// request takes effect once: a retried Deregister is not told NotFound, a
// retried Register does not bump the version.
//
// # Leases
//
// A record is registered with a lease (bounded by the server's MinLease
// and MaxLease). The client that registered it renews it every third of
// the lease from a goroutine it owns, until Deregister or Close; a server
// that lost the record (restarted, or the lease lapsed while unreachable)
// answers the renewal "not found" and gets a fresh Register. When a lease
// lapses the node is presumed dead: the server clears its slot under a new
// version.
//
// # Several servers
//
// A Client takes the Info of every MetaServer of the cluster. Register,
// renewals and Deregister go to all of them at once; if some fail the call
// returns a *PartialError naming each (and renewals keep repairing them).
// Fetch READs from the server that answered last, failing over to the next
// on error; the first answer (record or ErrNotFound) is final. Each server
// gets its own reader (DCI or RC QP), UD QP and CQs on the client, so a
// dead server stalls only requests to itself.
//
// # Membership: records kept elsewhere (etcd)
//
// By default a server keeps the records itself, as above: the embedded
// mode, for one host or an in-process cluster. Given a Membership
// (ServerConfig.Membership; package etcdstore keeps one in etcd, and
// MemMembership one in memory), the server is instead a READ-able mirror
// of it: nodes Register their record in the store under a lease the store
// keeps alive, the server Watches it (a complete set, then changes) and
// writes each record into its table from its loop goroutine, as it writes
// its own, and it Announces its Info in the store so that nodes and tools
// find it. Leases are the store's: the server keeps none, answers UD
// Register, Renew and Deregister "invalid" (ErrBadRecord) and serves Hello
// and RC connects as before. Any number of servers mirror one store and
// hold the same records (each under its own versions); a restarted one
// rebuilds its table from the store's complete set. While the store is out
// of reach a table keeps what it holds, so lookups go on.
//
// # Trust
//
// Clients cannot write the table: its region, DCT and RC readers allow
// remote READ only. The request QP is not authenticated: anyone who knows the QKey can
// register or deregister any node, as in KRCore.
package meta
