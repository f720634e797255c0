// Package udrpc is krcore's request/reply exchange over unreliable datagrams
// (UD): the control path that needs neither a connection nor DC. The
// MetaServer's clients register through it, and runtimes on devices without
// DC set up RC connections and look up regions through it.
//
// An Endpoint is one UD QP with its own CQ, receive and send buffers. Call
// sends a request carrying an id chosen by the caller and waits for the
// reply with that id; since UD may drop a datagram, it sends again with a
// doubling timeout, always with the same id, so the peer can recognise a
// copy and answer without acting twice. The framing of messages is the
// caller's: Config.ReplyID tells a reply (and the id it answers) from a
// request, and requests go to Config.OnRequest.
//
// No goroutine is dedicated to polling: whoever waits (a caller for its
// reply, an owner serving requests through Wait) takes a turn draining the
// CQ, as Poller describes. A QP that an unreachable destination moved to
// ERR is reset in place on the next Send, so its number, which peers
// know, stays valid.
package udrpc
