package api

import (
	"errors"
	"fmt"
	"net/http"
	"path"
	"strings"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/volume"
)

// The volume routes: E2B's control plane (/volumes, API key) and its
// volume content API (/volumecontent, the volume's own bearer token, no
// API key), as E2B's SDKs call them.

func (s *Server) volumeRoutes(mux *http.ServeMux, auth func(string, http.HandlerFunc)) {
	auth("POST /volumes", s.createVolume)
	auth("GET /volumes", s.listVolumes)
	auth("GET /volumes/{volumeID}", s.getVolume)
	auth("DELETE /volumes/{volumeID}", s.deleteVolume)
	// The content API is served where the volume lives (the backend's
	// VolumeContent: this host's store, or the volume's fleet node).
	content := func(w http.ResponseWriter, r *http.Request) {
		s.cfg.Backend.VolumeContent(w, r, r.PathValue("volumeID"))
	}
	for _, pattern := range []string{
		"GET /volumecontent/{volumeID}/dir", "POST /volumecontent/{volumeID}/dir",
		"GET /volumecontent/{volumeID}/path", "PATCH /volumecontent/{volumeID}/path", "DELETE /volumecontent/{volumeID}/path",
		"GET /volumecontent/{volumeID}/file", "PUT /volumecontent/{volumeID}/file",
	} {
		mux.HandleFunc(pattern, content)
	}
}

func (s *Server) volumeJSON(v service.VolumeInfo) wire.VolumeAndToken {
	return wire.VolumeAndToken{VolumeID: v.ID, Name: v.Name, Token: v.Token, Domain: s.cfg.Domain}
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req wire.NewVolume
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	v, err := s.backend(r).CreateVolume(r.Context(), identityOf(r.Context()).Name, req.Name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.volumeJSON(v))
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	list, err := s.backend(r).ListVolumes(r.Context(), identityOf(r.Context()).Name)
	if err != nil {
		writeError(w, err)
		return
	}
	out := []wire.Volume{}
	for _, v := range list {
		out = append(out, wire.Volume{VolumeID: v.ID, Name: v.Name})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.backend(r).GetVolume(r.Context(), identityOf(r.Context()).Name, r.PathValue("volumeID"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.volumeJSON(v))
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	if err := s.backend(r).DeleteVolume(r.Context(), identityOf(r.Context()).Name, r.PathValue("volumeID")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resolveMounts checks a create's volumeMounts as E2B does (every problem
// listed, one line per mount, 400) and finds each volume by name among the
// caller's. The backend's Create finds where each volume is (and holds
// it until the sandbox is registered).
func (s *Server) resolveMounts(r *http.Request, in []wire.VolumeMount) ([]volume.Mount, error) {
	if len(in) == 0 {
		return nil, nil
	}
	owner := identityOf(r.Context()).Name
	var out []volume.Mount
	var problems []string
	used := map[string]bool{}
	for i, m := range in {
		bad := func(format string, args ...any) {
			problems = append(problems, fmt.Sprintf("\t- volume mount #%d: %s", i, fmt.Sprintf(format, args...)))
		}
		switch {
		case m.Path == "":
			bad("path cannot be empty")
			continue
		case !strings.HasPrefix(m.Path, "/"):
			bad("path must be absolute")
			continue
		case path.Clean(m.Path) != m.Path:
			bad("path must not contain any '.' or '..' components")
			continue
		case m.Path == "/" || systemPath(m.Path):
			bad("path %s is the sandbox's own (/, /proc, /sys, /dev and what is under them): mount the volume elsewhere, such as /mnt/%s", m.Path, m.Name)
			continue
		case used[m.Path]:
			bad("path '%s' is already used", m.Path)
			continue
		}
		used[m.Path] = true
		v, err := s.backend(r).VolumeByName(r.Context(), owner, m.Name)
		if errors.Is(err, errdefs.ErrNotFound) {
			bad("volume '%s' not found", m.Name)
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, volume.Mount{ID: v.ID, Name: v.Name, Path: m.Path})
	}
	if len(problems) > 0 {
		return nil, errdefs.Invalid("invalid mounts:\n%s", strings.Join(problems, "\n"))
	}
	return out, nil
}

func systemPath(p string) bool {
	for _, sys := range []string{"/proc", "/sys", "/dev"} {
		if p == sys || strings.HasPrefix(p, sys+"/") {
			return true
		}
	}
	return false
}
