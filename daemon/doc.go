// Package daemon is krcored's server side: it serves one node's
// core.Runtime to every process on the node over a Unix socket and shared
// memory (the protocol is package wire's), so processes share the node's
// pooled QPs the way goroutines of one process do.
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
// who may attach. Per-client limits bound VQs and registered bytes.
//
// # Data path
//
// Every client VQ is a core.Queue here with the same credits, driven by two
// goroutines (three once bound to a port): the submitter consumes the
// submission ring and pushes, the completer pops the queue and fills the
// completion ring, the messenger fills the message ring. Each waits the wire
// way (spin briefly, then sleep on an eventfd or in the runtime), so an idle
// client costs no CPU. Fairness between clients is that of the Go scheduler
// between these goroutines: a submitter yields after every batch, and a
// flooding client can hold no more than its credits in the runtime.
//
// # Lifecycle
//
// When a client's socket closes (exit, crash, SIGKILL) the daemon stops its
// goroutines, closes its VQs (requests in flight retire unseen), withdraws
// its exports, deregisters its MRs and unmaps its memfds: nothing of it
// remains, and no other client notices. Close says goodbye to every client
// (OpBye) and reclaims them all, so clients fail with ErrDaemonGone.
package daemon
