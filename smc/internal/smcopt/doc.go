// Package smcopt puts the SMC TCP option (kind 254, length 6, experiment
// ID E2 D4 C3 D9: "SMCR" in EBCDIC) into the SYN-ACKs of a TCP listener
// and the SYN of a dialed connection, for the sockets an Announcer marked
// (Announcer.Control, as a net.ListenConfig's or net.Dialer's Control:
// any port), and reads it back from a peer's SYN (PeerAnnounced) or from
// the SYN-ACK a marked dialer got (Announcer.ServerAnnounced). That is
// how the Linux kernel's AF_SMC detects an SMC peer before any byte: a
// kernel client whose SYN-ACK lacks the option falls back to TCP
// (PEERNOSMC) and never sends its CLC proposal, and so does a dialer
// here.
//
// Go's sockets cannot set a TCP option in a SYN or SYN-ACK. Two ways exist
// from user space, and this package takes the first:
//
//   - A cgroup BPF sock_ops program with the TCP header option callbacks
//     (Linux 5.10 and later): the kernel's own TCP stack keeps doing the
//     handshake, retransmissions and everything after, and the program
//     only reserves six bytes in the SYN or SYN-ACK and writes the option.
//     The sockets it serves are marked in a socket storage map (a u32 per
//     socket, BPF_MAP_TYPE_SK_STORAGE, with the one-type BTF the kernel
//     requires for it); the program records there whether a marked
//     dialer's SYN-ACK carried the option (bpf_load_hdr_opt).
//     It needs CAP_BPF and CAP_NET_ADMIN (root) once, to load and attach;
//     the program is about 60 instructions, assembled here and loaded
//     with bpf(2) through golang.org/x/sys/unix, so the module needs no
//     BPF library (cilium/ebpf would be the one for a larger program). It is attached
//     through a BPF link, so it goes away when the Announcer is closed or
//     its process dies.
//   - A raw socket would have to build the SYN-ACK itself while the
//     kernel's stack, which also sees the SYN, answers it with a RST
//     unless a firewall rule hides the port: a second TCP implementation
//     for one option.
//
// Reading the peer's option needs no privileges: TCP_SAVE_SYN on the
// listener keeps each connection's SYN, TCP_SAVED_SYN returns it once.
//
// The option is off unless an Announcer was made: the smc package keeps
// working unprivileged (first-bytes detection toward its own peers, TCP
// fallback toward others).
package smcopt
