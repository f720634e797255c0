// Package smc is SMC-R (RFC 7609) in Go on krcore: net.Conn and
// net.Listener that carry a TCP application's bytes with RDMA WRITEs when
// both ends can, and over their TCP connection when not. Changing
// net.Listen and net.Dial to Listen and Dial (with Options naming the
// process's Node) is the whole port of a program. Between krcore peers it
// uses only the root vocabulary package (krcore.API), so it runs on an
// embedded runtime (core.Embed) and through krcored (client.Attach)
// alike; toward Linux kernel AF_SMC peers it speaks SMC-Rv2 on an RDMA
// device (the kernel wire mode, below).
//
// # Connections
//
// Every connection starts as a TCP connection, which stays beside it for
// its life: it gives the addresses, carries the handshake, and its end
// tells a connection that its peer died. A Node (Open) is a process's SMC
// endpoint: a port bound on its krcore node, to which peers' notifications
// and CDC messages go, and registered memory from which connections take
// their buffers.
//
// # Handshake
//
// The CLC exchange of RFC 7609 runs on the TCP connection, in its message
// shapes (eyecatcher "SMCR" in EBCDIC, type, length, version, body,
// trailer): the client's proposal names its node, port and token; the
// server answers with an accept naming its own and its receive buffer, or
// a decline with RFC 7609's reason code (Reason); the client confirms,
// offering its buffer, once it reached the server's, or declines. Any
// failure up to the confirm (no Node, a decline, the peer's node or
// buffer unreachable, no memory, a timeout) falls back to TCP, recorded on
// the connection: ModeOf says SMC, or TCP and why (the reason code, and
// in Mode.Err the error of this side's step that failed; a decline
// carries only the peer's code, its error stays there). No application byte
// travels before the choice, so none is lost or duplicated by it. After
// the confirm the client may write at once, so a server that then cannot
// find the client's buffer, or a client that neither confirms nor
// declines within the handshake timeout, breaks the accepted connection:
// reads and writes on it fail, and the client sees its TCP connection end
// (ECONNRESET).
//
// # Trust
//
// RFC 7609 believes the CLC: the node, port, token and buffer a message
// names. Here any local process can open a TCP connection and name
// another's, so what a peer may have this side WRITE, and what moves a
// connection's cursors, rests on what only the connection's own peer
// holds:
//
//   - A Node never lets two of its connections WRITE into the same bytes
//     of a peer's region at once. A peer's slab is exported to this
//     Node's port alone, so every WRITE into it comes from this Node, and
//     the peer hands an element to one connection at a time, after the
//     last one said it writes no more: a confirm (or a rogue server's
//     accept, or a move offer) naming bytes another connection still
//     WRITEs into is a forgery. The server breaks such a connection; the
//     client declines and falls back to TCP (ReasonConfig).
//   - Tokens are drawn from crypto/rand per connection, not counted: a
//     forgery naming a free element and a guessed token writes into
//     memory no connection reads, and its notifications name no
//     connection (Stats.Dropped).
//   - Each connection draws a 64-bit key, named in its CLC messages
//     (after the buffer size: this package's CLC carries an export name
//     where RFC 7609 has an rkey and address, so its body is its own) and
//     carried by the peer's CDC messages (in RFC 7609's reserved bytes)
//     and buffer move offers: without it they are dropped, so a process
//     that knows a token cannot move the connection's cursors, end or
//     abort it.
//   - A Node's dialled connections take their receive buffers from slabs
//     apart from those of the connections it accepted: an accept names
//     its slab to whoever proposed, which may be a process claiming to be
//     the peer, and so never names one the Node's dialled connections use.
//
// What is left: a WRITE_WITH_IMM's notification names its connection by
// the 32-bit token alone (the immediate), so a process on the peer's node
// able to WRITE into some region of this node could move a connection's
// producer cursor by guessing, one in 2^32 per live connection a guess.
// A rogue server that proposed to a real one as a client learns the real
// server's slab for that client's accepted connections, and can accept
// the client's dial naming a free element of it: the client WRITEs into
// memory no connection reads, and while that connection lasts a later
// connection of the client to the real server given that element falls
// back to TCP (a denial of SMC, not an injection). The kernel wire mode
// speaks the kernel's own messages (Options.RDMA).
//
// # Detection, and what it cannot do
//
// Linux detects an SMC peer with a TCP option in the SYN, before any
// byte. A process without privileges cannot set TCP options, so this
// package detects by first bytes, which only works when the client speaks
// first:
//
//   - Dial sends its proposal as the first bytes of the stream and waits
//     for the answer. Only dial Listeners of this package with a Node: a
//     plain TCP server would read the proposal as its application's data
//     (and a server-first one's greeting ends the wait: the client falls
//     back with ReasonPeerNoSMC and keeps the greeting as data). Dial
//     without a Node sends nothing and is plain TCP.
//   - Accept returns at once, and the client's first bytes are read in
//     the background: a proposal starts the handshake, anything else is
//     data of a plain client (TCP, ReasonPeerNoSMC) and is delivered
//     whole. A plain client whose first bytes happen to start with the
//     eyecatcher waits up to the handshake timeout while they are checked.
//   - A server-first protocol (SMTP, MySQL) writes before it reads: its
//     first Write waits up to Options.DetectWait (default 10ms) for the
//     client's first bytes. An SMC client's proposal, sent right after
//     the TCP handshake, normally arrives within that; if it does not, the
//     server runs TCP and the late proposal is dropped from the stream (its
//     client sees the server's bytes first and falls back too). So a plain
//     client of a server-first protocol waits DetectWait once, for the
//     greeting, and an SMC client on a slow path may end on TCP.
//
// # Data path
//
// Each side has one receive buffer (an RMB element) in memory it
// registered and exported with remote write; the peer RDMA WRITEs bytes
// into it as a ring, at its producer cursor, with WRITE_WITH_IMM: the
// immediate is the receiver's token, and the notification (length = bytes
// written, delivered once they are in place) moves the producer cursor.
// The receiver returns its consumer cursor in a CDC message (RFC 7609's
// 44-byte shape: cursors as wrap sequence and offset, producer and
// connection-state flags) sent as a small SEND, and only as RFC 7609's
// rule (as Linux applies it) says: once more than a tenth of the buffer
// was read since the last update, and the writer has at most half the
// buffer free or said it is blocked. A writer waits while the peer's
// buffer is full, and not for its WRITEs to complete: it stages bytes in
// a ring of the buffer's size and waits for completions only when that
// ring is full of WRITEs in flight, as TCP's write returns once the
// kernel holds the bytes (a completion that reports a failure aborts the
// connection; the next read or write sees it). CloseWrite and Close send the done-writing and closed
// flags after every byte; the peer reads them all, then EOF. A peer whose
// TCP connection ends without its close flag arriving within a second is
// taken for dead: reads return what arrived, then an error matching
// syscall.ECONNRESET, as do writes; an RDMA request that fails aborts the
// connection the same way, and so does the Node's runtime failing (the
// krcored it runs through stops): every SMC connection of the Node
// aborts at once, and later ones fall back to TCP (ReasonLink or
// ReasonMem). Close the API after the Node and its connections: their
// buffers are in the API's memory, which its Close releases (the
// addresses stay mapped to zero pages: a connection still open then reads
// zeros or fails, and never faults the process).
//
// Buffer sizes adapt (NodeOptions.BufferSize 0): a connection starts with
// buffers of DefaultBufferSize, or MinBufferSize once a quarter of the
// Node's memory bound (NodeOptions.MaxMemory) is taken, so that many
// idle connections take little each. A receiver whose peer waited for
// window twice since its last change (a stream whose reader keeps up,
// which a buffer bounds to one buffer's worth per cursor round trip)
// offers the peer a buffer four times larger, up to
// NodeOptions.MaxBufferSize (past 1 MiB only for a writer that said
// twice, with a CDC flag not in RFC 7609, that its waits for window took
// a millisecond or more: there the cursor's trip back bounds the stream,
// as through krcored, while in one process 4 MiB buffers streamed slower
// than 1 MiB), in a move message (not in RFC 7609, whose RMBs keep their
// size): the peer WRITEs every later byte there, and says
// from which stream position with a CDC flag on the same queue, behind
// the bytes before it; the receiver reads its old buffer to that point,
// then gives it back. A grown buffer whose connection idles (nothing
// arrives, everything read) for a second moves back the same way to a
// new connection's size. The writer's staging ring follows the size of
// the buffer it writes. Stats counts the grows and shrinks. Cursors
// between krcore peers are stream positions (wraps of 4 GiB and offset),
// so they mean the same in either buffer. No buffer grows past the
// Node's bound; a connection whose first buffers do not fit falls back
// (ReasonMem). A slab of grown buffers whose buffers all came back is
// released while its pool has another free one; other slabs stay, known
// to their peer, for later connections. A writer forgets the regions of
// buffers offered mid-stream once no connection uses them, all but the
// latest eight (a peer's spare slab of grown buffers is the next stream's),
// so that a long-lived Node does not collect the names of every slab its
// peers released. Through krcored the daemon keeps a region a client
// looked up until the client detaches: there is no call to release one.
//
// Urgent data (Conn.WriteUrgent, ReadUrgent) is TCP's MSG_OOB: one byte
// out of band, which reads skip, at its place in the stream. Over SMC
// the sender WRITEs it without a notification and a CDC message with
// RFC 7609's urgent flags announces it (its producer cursor is the byte's
// end), so that the byte and its flags arrive together, as Linux's CDC
// messages carry both; over TCP it is the kernel's urgent byte. The
// kernel wire mode has none.
//
// Link reuse: connections take their buffers from slabs (16 buffers; of
// grown ones, 1 MiB) that a Node
// registers and exports per peer endpoint (node and port) at a time, to
// that endpoint alone (an export with an audience: as SMC-R keeps an RMB
// per link group, no other process can find the slab, let alone write to
// it), and a Node remembers the peers' slabs it learned. So a later
// connection between the same two endpoints adds a buffer and a token:
// connections to one peer endpoint share up to four virtual queues on
// krcore's pooled QPs (which are the links), a connection holding one from
// a push to its completions, so there is no new queue, QP, export or
// lookup until a slab is full, and a thousand connections through krcored
// stay within its per-client bound on queues.
//
// # Kernel wire mode: SMC-Rv2 with Linux's AF_SMC
//
// With Options.RDMA (OpenRDMA: an ibverbs device, port and GID, the
// network interface under it and a UEID), Listen and Dial speak SMC-Rv2
// as the Linux kernel does, to kernel AF_SMC peers, over real RDMA (rxe or
// a RoCE NIC): CLC v2 proposal, accept and confirm with first-contact
// extensions on the TCP connection, link groups of one RC QP confirmed
// with LLCv2 CONFIRM_LINK, RMBs written with RDMA WRITEs and CDC messages
// for the cursors and close flags. Later connections to the same kernel
// peer reuse its link group (no first contact; the kernel confirms each
// new buffer's rkey with CONFIRM_RKEY, answered); an ADD_LINK request is
// declined as the kernel's own client declines one (no alternate path),
// so a group keeps one link; a group without connections lingers
// (RDMAConfig.Linger), then ends with DELETE_LINK so the kernel frees its
// side. The SMC TCP option goes into the listener's SYN-ACKs and the
// dialer's SYNs through a cgroup BPF program (root once; the sockets are
// marked, so any port): a client whose SYN lacks it, or that does not
// propose, is served over TCP (ReasonPeerNoSMC), and Dial proposes only
// to a server whose SYN-ACK carried it (else TCP, ReasonPeerNoSMC, as the
// kernel's client); a proposal without the UEID is declined. A process
// that cannot load the program (no CAP_BPF and CAP_NET_ADMIN) tries once,
// and its Listen and Dial then run plain TCP: ModeOf says
// ReasonNoRuntime, with the EPERM in Mode.Err. It needs a
// build with -tags rdma (cgo, libibverbs): without it OpenRDMA fails with
// an error wrapping ibverbs.ErrNotBuilt. A Go process killed mid-connection
// sends nothing more (no DELETE_LINK): the kernel ends its side when its
// link test finds the link dead, net.smc.smcr_testlink_time (30 s by
// default) plus 2 s after the link's last message. Not built: a second
// link (and so failover), urgent data.
//
// # Tools
//
// A Node lists its connections as Linux's smcss does (Node.Conns: state,
// role, local and foreign address, mode SMC or TCP with the fallback
// reason, tokens, receive buffer sizes, cursors as wrap:offset) and
// counts as smcr-stats does (Node.Stats: connections on SMC, fallbacks by
// reason, bytes, RDMA WRITEs, cursor messages); Node.Report is both, as
// JSON-ready data. The connections live in application processes, which
// the daemon cannot see into, so:
//
//   - Through krcored (an API with a Report method, client.Client), a
//     Node reports to the daemon every NodeOptions.ReportEvery (1 s) while
//     its report changes, under ReportName (one per Node, at most 40 KiB:
//     the newest connections past it are counted, not listed), and
//     withdraws it on Close; the daemon drops a process's reports when it
//     detaches or dies. `krctl smc` (-json) lists every process's
//     connections and counters from there, with each report's age, and
//     krcored's /metrics carries the counters as krcored_smc_* by client
//     and port. A view up to ReportEvery old, at the cost of one control
//     call per Node per interval while anything changes.
//   - Embedded, there is no daemon: Node.Report, Stats and Conns are the
//     interface, to publish as the program likes (expvar.Publish of a
//     func returning Node.Report, or a Prometheus collector).
//
// # Not built yet
//
// A zero-copy io.ReaderFrom (ReadFrom reads the source into a buffer of its own, see
// there; WriteTo hands the writer the receive buffer's bytes). A slab
// serves every connection with one peer endpoint, so that peer could
// write into its other connections' buffers, as an RMB's rkey lets any
// connection of its link group in SMC-R. A port's notifications beyond krcore's inbox bound
// (4096 waiting) would be dropped; a connection has a few in flight at
// most.
package smc
