package service

import "context"

// Fleet is what the node routes need of a fleet's API server.
type Fleet interface {
	// NodeList returns the nodes (JSON-encodable), alive or lost.
	NodeList(ctx context.Context) (any, error)
	// Cordon stops placement on a node; mode "drain" also marks it as
	// being emptied. Uncordon lets placement use it again.
	Cordon(ctx context.Context, node, mode string) error
	Uncordon(ctx context.Context, node string) error
	// Forget removes a lost node and the records of its sandboxes.
	Forget(ctx context.Context, node string) error
}
