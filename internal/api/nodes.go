package api

import (
	"net/http"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/service"
)

func (s *Server) fleet() (service.Fleet, error) {
	if s.cfg.Fleet == nil {
		return nil, errdefs.NotFound("this server is not a fleet (agentenv serve runs one machine): nodes exist behind `agentenv api`")
	}
	return s.cfg.Fleet, nil
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	f, err := s.fleet()
	if err != nil {
		writeError(w, err)
		return
	}
	list, err := f.NodeList(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

// nodeAction is POST /agentenv/nodes/{name}/cordon|uncordon|drain|forget.
func (s *Server) nodeAction(w http.ResponseWriter, r *http.Request) {
	f, err := s.fleet()
	if err != nil {
		writeError(w, err)
		return
	}
	name := r.PathValue("name")
	switch a := r.PathValue("action"); a {
	case "cordon", "drain":
		err = f.Cordon(r.Context(), name, a)
	case "uncordon":
		err = f.Uncordon(r.Context(), name)
	case "forget":
		err = f.Forget(r.Context(), name)
	default:
		err = errdefs.NotFound("no node action %q: use cordon, uncordon, drain or forget", a)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
