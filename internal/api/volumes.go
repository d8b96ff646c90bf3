package api

import (
	"fmt"
	wire "github.com/agentenv/agentenv/api"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"

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
	content := func(pattern string, h func(http.ResponseWriter, *http.Request, string)) {
		mux.Handle(pattern, s.volumeToken(h))
	}
	content("GET /volumecontent/{volumeID}/dir", s.volumeListDir)
	content("POST /volumecontent/{volumeID}/dir", s.volumeMakeDir)
	content("GET /volumecontent/{volumeID}/path", s.volumeStat)
	content("PATCH /volumecontent/{volumeID}/path", s.volumeUpdate)
	content("DELETE /volumecontent/{volumeID}/path", s.volumeRemove)
	content("GET /volumecontent/{volumeID}/file", s.volumeRead)
	content("PUT /volumecontent/{volumeID}/file", s.volumeWrite)
}

// volumes returns the store, or answers that this server has none.
func (s *Server) volumes(w http.ResponseWriter) *volume.Store {
	if s.cfg.Volumes == nil {
		writeError(w, errdefs.Unavailable("this server has no volumes: volumes live on one host and are served by `agentenv serve`, not yet through `agentenv api`"))
	}
	return s.cfg.Volumes
}

func (s *Server) volumeJSON(v volume.Volume) wire.VolumeAndToken {
	return wire.VolumeAndToken{VolumeID: v.ID, Name: v.Name, Token: s.cfg.Volumes.Token(v.ID), Domain: s.cfg.Domain}
}

// entryJSON is a volume entry as the content API answers it.
func entryJSON(e volume.Entry) wire.VolumeEntryStat {
	return wire.VolumeEntryStat{Name: e.Name, Type: e.Type, Path: e.Path, Size: e.Size, Mode: e.Mode, UID: e.UID, GID: e.GID,
		Atime: e.Atime, Mtime: e.Mtime, Ctime: e.Ctime, Target: e.Target}
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	st := s.volumes(w)
	if st == nil {
		return
	}
	var req wire.NewVolume
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	v, err := st.Create(identityOf(r.Context()).Name, req.Name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.volumeJSON(v))
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	st := s.volumes(w)
	if st == nil {
		return
	}
	out := []wire.Volume{}
	for _, v := range st.Volumes(identityOf(r.Context()).Name) {
		out = append(out, wire.Volume{VolumeID: v.ID, Name: v.Name})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	st := s.volumes(w)
	if st == nil {
		return
	}
	v, err := st.Get(identityOf(r.Context()).Name, r.PathValue("volumeID"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.volumeJSON(v))
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	st := s.volumes(w)
	if st == nil {
		return
	}
	if err := st.Delete(identityOf(r.Context()).Name, r.PathValue("volumeID")); err != nil {
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

// volumeToken admits a content request that carries the volume's token.
func (s *Server) volumeToken(h func(http.ResponseWriter, *http.Request, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Volumes == nil {
			contentError(w, errdefs.Unavailable("this server has no volumes"))
			return
		}
		id := r.PathValue("volumeID")
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			contentError(w, fmt.Errorf("no volume token: send 'Authorization: Bearer <token>' with the token GET /volumes/%s returns: %w", id, errdefs.ErrUnauthenticated))
			return
		}
		if err := s.cfg.Volumes.CheckToken(id, tok); err != nil {
			contentError(w, err)
			return
		}
		h(w, r, id)
	})
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

func (s *Server) volumeListDir(w http.ResponseWriter, r *http.Request, id string) {
	depth := 1
	if d := r.URL.Query().Get("depth"); d != "" {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 {
			contentError(w, errdefs.Invalid("depth=%q is not a non-negative number", d))
			return
		}
		depth = n
	}
	list, err := s.cfg.Volumes.ListDir(id, r.URL.Query().Get("path"), depth)
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

func (s *Server) volumeMakeDir(w http.ResponseWriter, r *http.Request, id string) {
	a, err := attrs(r)
	if err == nil {
		var e volume.Entry
		if e, err = s.cfg.Volumes.MakeDir(id, r.URL.Query().Get("path"), a, force(r)); err == nil {
			writeJSON(w, http.StatusCreated, entryJSON(e))
			return
		}
	}
	contentError(w, err)
}

func (s *Server) volumeStat(w http.ResponseWriter, r *http.Request, id string) {
	e, err := s.cfg.Volumes.Stat(id, r.URL.Query().Get("path"))
	if err != nil {
		contentError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, entryJSON(e))
}

func (s *Server) volumeUpdate(w http.ResponseWriter, r *http.Request, id string) {
	var body wire.VolumeMetadata
	if err := decode(w, r, &body); err != nil {
		contentError(w, err)
		return
	}
	e, err := s.cfg.Volumes.UpdateMetadata(id, r.URL.Query().Get("path"), volume.Attrs{UID: body.UID, GID: body.GID, Mode: body.Mode})
	if err != nil {
		contentError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, entryJSON(e))
}

func (s *Server) volumeRemove(w http.ResponseWriter, r *http.Request, id string) {
	if err := s.cfg.Volumes.Remove(id, r.URL.Query().Get("path")); err != nil {
		contentError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) volumeRead(w http.ResponseWriter, r *http.Request, id string) {
	f, err := s.cfg.Volumes.ReadFile(id, r.URL.Query().Get("path"))
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

func (s *Server) volumeWrite(w http.ResponseWriter, r *http.Request, id string) {
	a, err := attrs(r)
	if err == nil {
		var e volume.Entry
		if e, err = s.cfg.Volumes.WriteFile(id, r.URL.Query().Get("path"), r.Body, a, force(r)); err == nil {
			writeJSON(w, http.StatusCreated, entryJSON(e))
			return
		}
	}
	contentError(w, err)
}

// resolveMounts checks a create's volumeMounts as E2B does (every problem
// listed, one line per mount, 400) and finds each volume by name among the
// caller's.
func (s *Server) resolveMounts(owner string, in []wire.VolumeMount) ([]volume.Mount, error) {
	if len(in) == 0 {
		return nil, nil
	}
	if s.cfg.Volumes == nil {
		return nil, errdefs.Invalid("volume mounts are not enabled on this server: volumes are served by `agentenv serve`, not yet through `agentenv api`")
	}
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
		v, err := s.cfg.Volumes.ByName(owner, m.Name)
		if err != nil {
			bad("volume '%s' not found", m.Name)
			continue
		}
		out = append(out, volume.Mount{ID: v.ID, Name: v.Name, Path: m.Path, Source: s.cfg.Volumes.DataDir(v.ID)})
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

// holdMounts resolves a create's volume mounts and holds the volumes until
// release (after the create returned): a delete racing the create is
// refused.
func (s *Server) holdMounts(r *http.Request, in []wire.VolumeMount) ([]volume.Mount, func(), error) {
	mounts, err := s.resolveMounts(identityOf(r.Context()).Name, in)
	if err != nil || len(mounts) == 0 {
		return nil, func() {}, err
	}
	ids := make([]string, len(mounts))
	for i, m := range mounts {
		ids[i] = m.ID
	}
	release, err := s.cfg.Volumes.Hold(ids...)
	if err != nil {
		return nil, nil, err
	}
	return mounts, release, nil
}
