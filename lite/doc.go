// Package lite is LITE (SOSP'17) on krcore: an indirection layer that
// shows applications named remote memory behind opaque handles, never an
// rkey. It uses only the root vocabulary package (krcore.API), so the same
// code runs on an embedded runtime (core.Embed) and through krcored
// (client.Attach).
//
// What is built (issue 15):
//
//   - A Node is a process's LITE endpoint (Open): a virtual queue bound to
//     a well-known port, served by one goroutine that answers other nodes'
//     control messages (Map, Unmap) with SENDs.
//   - Malloc makes an LMR on this node, which is its master, under a name
//     and with the permissions (Read, Write, Atomic) it allows mappers.
//   - Map asks the master by name for a permission; the master refuses
//     what the LMR does not allow (ErrPerm) and grants the rest by
//     exporting the LMR under a fresh name with exactly the granted
//     access, so the rights are enforced at the responder, where the
//     memory lives. The mapper gets a Handle, opaque and valid only in the
//     Node that mapped it.
//   - A grant is bound to the mapper's process. A Node's requests go out
//     from its queue bound to its port, so a master sees each from the
//     principal (node, port) the sender's runtime vouches for
//     (Message.From, Message.Port), and exports the grant to that
//     principal alone (krcore.API.Export's audience); the mapper looks it
//     up as its bound queue (VQ.Region), and every node holding a piece
//     enforces the same. Another process that learns the grant's name
//     (reading the master's memory) gets ErrNoRegion: through krcored it
//     cannot bind the mapper's port, nor ask as a port its own queue does
//     not hold; elsewhere its node differs. It never gets a region id to
//     READ with, and the data path needs nothing more: krcored hands a
//     client only region ids of its own session. Unmap, Layout and the
//     admin requests are checked against the same principal.
//   - Read and Write move bytes through a handle with one-sided RDMA,
//     bounds checked, through a registered bounce buffer of the Node.
//   - MallocOn stripes an LMR over several nodes (Placement): each holds
//     one piece, allocated and exported when the master asks, and enforces
//     every grant's rights on it; the master keeps the layout and a mapper
//     fetches it at Map (in pages when long), then sends each request to
//     the node holding its stripe. Register makes caller-registered memory
//     an LMR (Free leaves it registered).
//   - LMR.Move moves an LMR's bytes to another node under its mappers: the
//     master withdraws every grant on the old copy (the responder finishes
//     what it was serving, refuses the rest), copies, grants again on the
//     new copy under the next generation's names; a mapper refused asks
//     the master for the layout (answered once the move is done) and
//     redoes its whole operation on the new copy, never half on each.
//   - Unmap withdraws one grant at the master; Free withdraws every grant
//     before it releases the memory, so a stale handle's READ is refused
//     by the responder and never reads freed memory.
//   - FetchAdd and CompareSwap run one RDMA atomic on an 8-byte word of an
//     LMR at the node holding it, through a handle mapped with Atomic (the
//     responder refuses any other), on the Node's own sync queue.
//   - Memset, Memcpy and Memmove run at the node holding dst's bytes: the
//     caller sends one control request naming its grants, and the holder
//     acts only through what they allow (Write on dst, Read on src),
//     copying locally, or READing src at src's node straight into dst
//     through a loan: one request to src's master, which checks the
//     caller's Read and grants Read on src to the holder's Node alone,
//     under a name that says whose loan it is, so that the holder READs
//     through it only for that caller (not through its own grants, nor
//     another's loans). The caller keeps the loan for later copies to that
//     holder; the master withdraws it with the grant lent (Unmap, Free,
//     SetPerm). The reply comes once the bytes are in place.
//   - A directory (Options.Directory, a node whose Node keeps name ->
//     master) finds an LMR's master by name: Malloc lists the name there
//     (a name is one master's), Free withdraws it, Master and MapName look
//     it up.
//   - A Lock (NewLock at its master, OpenLock elsewhere) is a ticket lock
//     in an LMR driven by one-sided atomics and READs, FIFO under
//     contention; a holder keeps it by renewing a lease, a silent one is
//     broken by the next waiter, which is told (ErrLockBroken), and a
//     waiter that gives up has its ticket handed on by its Node.
//   - Share and Admin, checked by the master against the grant the request
//     names: a mapping with Share lets another node Map the LMR with at
//     most its own rights; one with Admin frees the LMR (Node.Free) or sets
//     who may map it how (Node.SetPerm, as the master's LMR.SetPerm), and
//     grants beyond the new rights are withdrawn.
//   - RPC as LITE built it (RegisterRPC, Service.Recv, Reply, ReplyRecv,
//     Call): a caller's first call to a node sets up, with one control
//     exchange, a ring of slots at the callee (exported to the caller with
//     remote write only) and a reply area at the caller (exported to the
//     callee). A call is one WRITE_WITH_IMM of the request into a free
//     slot, whose immediate names the slot, the ring and the call; a
//     service's Recv waiting with nothing queued takes the notification
//     off the Node's port itself (pop.go), else whoever pops the port
//     queues the call for the service; the reply is
//     one WRITE_WITH_IMM into the caller's reply slot, notifying the port
//     of the queue the request came from (each caller queue holds one,
//     drawn at random from [1<<30, 1<<31), which other users of the
//     node's ports should avoid), so the calling goroutine waits for its
//     reply on that queue's port itself (taking it off the link, not from
//     krcore's receive-queue dispatcher) and polls its request's
//     completion at least every millisecond. Neither side waits for an
//     acknowledgement it does not need: Reply returns once its WRITE is
//     posted, a caller whose reply came first does not wait for its
//     request's, and the pooled queue's next use reaps the completion (a
//     caller whose WRITE fails while the reply has not come fails within
//     a millisecond). Slots are credits: a caller without one waits. Notifications that do not check out
//     (sender, ring, slot, length, call) are dropped. A ring is exported
//     to the calling Node's principal alone, a reply area to the callee's,
//     each under a random name.
//   - Send and Endpoint.Recv carry messages between named endpoints on the
//     same rings, acknowledged once the endpoint holds them.
//   - Barrier(master, name, count) meets count participants at a barrier
//     kept by master's Node, which answers them all when the last arrives;
//     reusable, and a participant that gives up is withdrawn.
//   - QoS as LITE built it, admission control at the sender: a Node's own
//     calls are High; WithPriority(Low) gives a Caller whose Read, Write
//     and Call wait at the Node's gate (SetQoS) for tokens of a bucket
//     whose rate is set every window from High's load and p99 latency by
//     LITE's three policies: Low is not throttled while no High op runs,
//     is capped while High's load is heavy, and is cut (AIMD) when High's
//     latency rises above what it is when High runs alone.
//
// The example applications (examples/lite-mapreduce, lite-graph, lite-log,
// each beside the same app over Go net/rpc) and krbench's lite test
// (docs/krbench.md) use the API above.
//
// Not covered: the principal is a port, not a process's lifetime. Close
// tells the masters to withdraw what the Node mapped, but a process that
// dies (or whose masters do not get that) leaves its grants
// exported to (node, port) until their LMRs are freed, and a later
// process that binds the port and knows a grant's name could look it up.
package lite
