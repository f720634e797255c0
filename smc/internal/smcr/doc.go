// Package smcr holds SMC-R's wire messages as the Linux kernel's net/smc
// (6.12) puts them on the wire, so that Go can speak SMC-Rv2 with AF_SMC
// sockets:
//
//   - CLC messages, on the TCP connection before either side chooses SMC
//     (RFC 7609 and IBM's SMC version 2 specification): Proposal (the
//     SMC-D area, the IP prefixes of version 1, the version 2 extension
//     with its user EIDs, RoCE GID and link limits, the SMC-Dv2
//     extension), AcceptConfirm (SMC-R's QP number, RMB rkey and address,
//     PSN, MTU and RMBE size; version 2's EID, first-contact extension and,
//     in a confirm, the GID list) and Decline with its diagnosis codes.
//   - LLC messages, SENDs on a link's RC QP that set up and tear down the
//     link group: ConfirmLink, AddLink (with version 2's rkey list),
//     DeleteLink, DeleteRkey, TestLink.
//   - CDC messages, the 44-byte SENDs that carry a connection's cursors
//     and flags.
//
// Each message decodes from bytes (never panicking: a malformed message is
// an error wrapping ErrMalformed that says what is wrong) and appends its
// encoding to a slice; the encoding of what the kernel sent is the bytes
// it sent (the tests hold such bytes, captured in .ci/smc-vm.sh's VM).
// Fields the kernel fills with zeros (reserved) are not kept.
//
// One quirk is the kernel's and is kept: an LLC version 2 header's length
// and ADD_LINK's rkey count are host-order u16s, little-endian on x86
// (big-endian on s390). The decoders take either order when it matches
// the message; Append writes little-endian, as the x86 kernel does.
package smcr
