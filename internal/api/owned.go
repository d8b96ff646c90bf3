package api

import (
	"net/http"

	"github.com/agentenv/agentenv/internal/service"
)

// backend is the Backend as the request's caller may use it: the whole of
// it for the single key and the operator, and for a named key a view of
// its own sandboxes, snapshots and volumes, of every template to use and
// of its own templates to change (service.Owned). Every route goes
// through it, in `agentenv serve` and `agentenv api` alike.
func (s *Server) backend(r *http.Request) service.Backend {
	id := identityOf(r.Context())
	if id.all() {
		return s.cfg.Backend
	}
	return service.Owned(s.cfg.Backend, id.Name)
}
