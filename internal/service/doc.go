// Package service is the seam every front end calls: Backend (sandboxes,
// snapshots, templates, volumes) with the types it speaks in, Fleet (the
// node operations of `agentenv api`), and the decorators that wrap a
// Backend (Owned, a named key's view; Metered, the operation metrics).
// Local implements Backend over this host's sandbox manager and stores;
// the fleet's router implements it over the network.
//
// It sits below the front ends (the REST API in internal/api, the
// SandboxFusion API, the fleet node's RPC service): it must not import
// them, nor anything of the fleet, so that the fleet can stand on it
// without standing on HTTP routes.
package service
