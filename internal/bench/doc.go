// Package bench is krbench (cmd/krbench, whose doc comment is the user's
// manual): perftest-style measurements of the soft RNIC, the KRCore runtime
// against raw verbs, krcored against the embedded runtime, and the
// ibv_rc_pingpong-compatible mode. Main runs it; the child processes it
// starts (the demo's server, krbench daemon's server node, krcored and
// connectors) are this binary again, in a role named by the first argument.
package bench
