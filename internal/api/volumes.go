package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/errdefs"
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

// serveContent serves a content request (method and the path's last
// element: dir, path or file) on st, if it carries volume id's token.
func serveContent(st *volume.Store, w http.ResponseWriter, r *http.Request, id string) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		contentError(w, fmt.Errorf("no volume token: send 'Authorization: Bearer <token>' with the token GET /volumes/%s returns: %w", id, errdefs.ErrUnauthenticated))
		return
	}
	if err := st.CheckToken(id, tok); err != nil {
		contentError(w, err)
		return
	}
	c := content{st}
	switch r.Method + " " + path.Base(r.URL.Path) {
	case "GET dir":
		c.volumeListDir(w, r, id)
	case "POST dir":
		c.volumeMakeDir(w, r, id)
	case "GET path":
		c.volumeStat(w, r, id)
	case "PATCH path":
		c.volumeUpdate(w, r, id)
	case "DELETE path":
		c.volumeRemove(w, r, id)
	case "GET file":
		c.volumeRead(w, r, id)
	case "PUT file":
		c.volumeWrite(w, r, id)
	default:
		contentError(w, errdefs.NotFound("no volume content route %s %s", r.Method, r.URL.Path))
	}
}

// content runs the content operations on one host's store.
type content struct{ st *volume.Store }

func (s *Server) volumeJSON(v VolumeInfo) wire.VolumeAndToken {
	return wire.VolumeAndToken{VolumeID: v.ID, Name: v.Name, Token: v.Token, Domain: s.cfg.Domain}
}

// entryJSON is a volume entry as the content API answers it.
func entryJSON(e volume.Entry) wire.VolumeEntryStat {
	return wire.VolumeEntryStat{Name: e.Name, Type: e.Type, Path: e.Path, Size: e.Size, Mode: e.Mode, UID: e.UID, GID: e.GID,
		Atime: e.Atime, Mtime: e.Mtime, Ctime: e.Ctime, Target: e.Target}
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

// contentError answers the content API's error shape: its code is the
// error class as a string, not the HTTP status (E2B's volume content
// spec).
func contentError(w http.ResponseWriter, err error) {
	status, code := errdefs.HTTPStatus(err)
	writeJSON(w, status, struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{code, err.Error()})
}

// attrs reads the optional uid, gid and mode query parameters.
func attrs(r *http.Request) (volume.Attrs, error) {
	var a volume.Attrs
	for name, dst := range map[string]**uint32{"uid": &a.UID, "gid": &a.GID, "mode": &a.Mode} {
		v := r.URL.Query().Get(name)
		if v == "" {
			continue
		}
		base := 10
		if name == "mode" && strings.HasPrefix(v, "0") {
			base = 8
		}
		n, err := strconv.ParseUint(v, base, 32)
		if err != nil {
			return a, errdefs.Invalid("query parameter %s=%q is not a number", name, v)
		}
		u := uint32(n)
		*dst = &u
	}
	return a, nil
}

func force(r *http.Request) bool {
	b, _ := strconv.ParseBool(r.URL.Query().Get("force"))
	return b
}

func (c content) volumeListDir(w http.ResponseWriter, r *http.Request, id string) {
	depth := 1
	if d := r.URL.Query().Get("depth"); d != "" {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 {
			contentError(w, errdefs.Invalid("depth=%q is not a non-negative number", d))
			return
		}
		depth = n
	}
	list, err := c.st.ListDir(id, r.URL.Query().Get("path"), depth)
	if err != nil {
		contentError(w, err)
		return
	}
	out := make([]wire.VolumeEntryStat, 0, len(list))
	for _, e := range list {
		out = append(out, entryJSON(e))
	}
	writeJSON(w, http.StatusOK, out)
}

func (c content) volumeMakeDir(w http.ResponseWriter, r *http.Request, id string) {
	a, err := attrs(r)
	if err == nil {
		var e volume.Entry
		if e, err = c.st.MakeDir(id, r.URL.Query().Get("path"), a, force(r)); err == nil {
			writeJSON(w, http.StatusCreated, entryJSON(e))
			return
		}
	}
	contentError(w, err)
}

func (c content) volumeStat(w http.ResponseWriter, r *http.Request, id string) {
	e, err := c.st.Stat(id, r.URL.Query().Get("path"))
	if err != nil {
		contentError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, entryJSON(e))
}

func (c content) volumeUpdate(w http.ResponseWriter, r *http.Request, id string) {
	var body wire.VolumeMetadata
	if err := decode(w, r, &body); err != nil {
		contentError(w, err)
		return
	}
	e, err := c.st.UpdateMetadata(id, r.URL.Query().Get("path"), volume.Attrs{UID: body.UID, GID: body.GID, Mode: body.Mode})
	if err != nil {
		contentError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, entryJSON(e))
}

func (c content) volumeRemove(w http.ResponseWriter, r *http.Request, id string) {
	if err := c.st.Remove(id, r.URL.Query().Get("path")); err != nil {
		contentError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (c content) volumeRead(w http.ResponseWriter, r *http.Request, id string) {
	f, err := c.st.ReadFile(id, r.URL.Query().Get("path"))
	if err != nil {
		contentError(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if fi, err := f.Stat(); err == nil {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	}
	w.WriteHeader(http.StatusOK)
	io.Copy(w, f)
}

func (c content) volumeWrite(w http.ResponseWriter, r *http.Request, id string) {
	a, err := attrs(r)
	if err == nil {
		var e volume.Entry
		if e, err = c.st.WriteFile(id, r.URL.Query().Get("path"), r.Body, a, force(r)); err == nil {
			writeJSON(w, http.StatusCreated, entryJSON(e))
			return
		}
	}
	contentError(w, err)
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
