// Package daemon is krcored's server side: it serves one node's
// core.Runtime to every process on the node over a Unix socket and shared
// memory (the protocol is package wire's), so processes share the node's
// pooled QPs the way goroutines of one process do.
//
// New serves a runtime the caller made (tests, in-process clusters); Start
// brings up the whole of krcored on a node, the RNIC (NodeConfig.Device),
// the runtime on it and the server, and is what cmd/krcored and krbench's
// krcored role both run.
//
// # Clients
//
// Each connection is a client with its own state: the MRs it registered
// (its memfds, mapped and registered with the runtime here), the regions it
// learned, the names it exported and its VQs. Identifiers are unique across
// the daemon and looked up in the client's own tables only, so naming
// another client's MR or region refuses the request (an error completion,
// in order, on that VQ only) as the runtime refuses any malformed request.
// SO_PEERCRED identifies the peer; Config.AllowUIDs and AllowGIDs restrict
// who may attach. Per-client limits bound VQs and registered bytes. A
// region learned stays until the client forgets it (OpForget) or detaches.
// A reply waits Config.SendTimeout at most for room in the client's
// socket: a client that leaves its replies unread is dropped.
//
// # Data path
//
// Every client VQ is a core.Queue here with the same credits. One goroutine
// per client, its pump, drives all of the client's VQs: it consumes their
// submission rings, pushes without waiting, and fills their completion
// rings; while idle it waits in the runtime as a core.Group (polling the
// completion queue briefly, then sleeping), woken by the runtime for
// completions and by a per-VQ goroutine that sleeps on the client's
// doorbell. A bound VQ has a messenger goroutine that fills its message
// ring. Config.Spin makes pumps poll longer before they sleep (spin mode).
//
// Fairness: a client has one runnable goroutine in the daemon however
// many VQs it has, a pump yields after a batch of SQEs over all its VQs,
// and Config.ClientCredits bounds a client's requests in flight across
// its VQs, so one client cannot fill the shared QPs' queues ahead of the
// others. Goroutines share the daemon's threads, not the node's cores:
// beside an interactive client a pump that worked Config.ShareQuantum
// without a break naps (see pump.share), so a flood leaves a core free
// for the other clients' wake-ups. A Connect on the ring runs in its own
// goroutine, so a cold connect holds up only its VQ.
//
// # Status
//
// Server.Status (OpStatus, krctl) snapshots the daemon: the runtime's
// counters, its shared QPs counted by type and listed one by one
// (core.Runtime.PoolQPs), the meta cache's counters and entries, and every
// client with its VQs. Through OpStatus a client of a user other than root
// and the daemon's own sees only its own user's clients, the others
// counted. A status too large for one message loses meta cache entries,
// then QP rows, and says how many.
//
// # Reports
//
// A client may keep small JSON reports at the daemon (OpReport, at most 16
// of 48 KiB each), replaced by name and dropped when it detaches: what a
// library running in its process over krcore tells krctl and /metrics
// about itself, since the daemon cannot see it. Server.Reports lists them
// (OpReports, krctl smc, which shows a user other than root and the
// daemon's own only its own user's); package smc's Nodes report their connections and
// counters under "smc/PORT", which the metrics collector exports as
// krcored_smc_* series by client and port.
//
// # Metrics
//
// Server.MetricsHandler serves Prometheus metrics from the server's own
// registry. A collector reads the counters from Status at each scrape, so
// they are counted once, where the runtime and the sessions count them;
// a client's series are those of the clients attached then. Three latency
// histograms share power-of-two buckets from 1 µs to 8.6 s:
// krcored_connect_seconds (a VQ Connect, by result), krcored_request_seconds
// (a request from its pump taking it off the ring to its completion posted,
// by opcode and size, over every client since the start) and
// krcored_client_request_seconds (the same, by attached client). The
// request histograms are the pump's own counters (latency): one clock read
// per working round, which its pacing (share) reads anyway, and a bit
// count and two unlocked atomic stores per completion, cheaper than a
// Prometheus histogram's Observe, since one pump writes them.
//
// # Lifecycle
//
// When a client's socket closes (exit, crash, SIGKILL) the daemon stops its
// goroutines, closes its VQs (requests in flight retire unseen), withdraws
// its exports, deregisters its MRs and unmaps its memfds: nothing of it
// remains, and no other client notices. Close says goodbye to every client
// (OpBye) and reclaims them all, so clients fail with ErrDaemonGone.
package daemon
