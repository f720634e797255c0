// Package etcdstore keeps a krcore cluster's membership in etcd: it is the
// meta.Membership that makes etcd the source of truth for node records,
// with the MetaServers as READ-able mirrors of it.
//
// # Keys
//
// Under Config.Prefix (default "/krcore/"):
//
//	nodes/NODE          a node's meta.Record as JSON, NODE zero-padded to 20 digits
//	metaservers/LEASE   a MetaServer's meta.Info text (meta.ParseInfo reads it)
//
// Every key is attached to an etcd lease held by whoever wrote it: a node
// registering its record (Register) or a MetaServer announcing itself
// (Announce). The Store keeps each lease alive from a goroutine it owns;
// if the process dies the lease lapses after its TTL (whole seconds,
// rounded up; etcd may raise it to its own minimum) and etcd deletes the
// key. If etcd stays out of reach longer than the TTL the lease lapses too
// and the keeper, once it reaches etcd again, takes a new one and writes
// the key anew. Lease.Close revokes the lease: the key goes at once.
//
// A node id is held by one fabric address at a time: Register refuses a
// live record of the node at another address (meta.ErrNodeInUse), in one
// etcd transaction against the key's revision, while the same address may
// replace its record (a node restarted on its device).
//
// # MetaServers
//
// A meta.Server given a Store (meta.ServerConfig.Membership) Watches it:
// a snapshot of nodes/ and then every change after the snapshot's
// revision, mirrored into its table; a broken watch (no leader, a
// compaction, a lost member) starts again from a new snapshot. Any number
// of MetaServers watch the same prefix and hold the same records, and a
// restarted one rebuilds its table from the snapshot. While etcd is
// unreachable the tables keep what they had: lookups and cached peers go on,
// and only changes wait.
//
// The watch requires a leader (clientv3.WithRequireLeader), so a member cut
// off from the others does not feed a stale view.
//
// etcd is the field's standard store for cluster state (Kubernetes keeps
// its own there), so operators already run it; the client module is the
// only dependency of this package, and the etcd server module is used by
// its tests alone.
package etcdstore
