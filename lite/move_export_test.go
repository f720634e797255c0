package lite

// Redone is how many operations n redid on the new copy of a moved LMR.
func Redone(n *Node) uint64 {
	return n.redone.Load()
}
