package service

import (
	"encoding/json"
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

// E2B's volume content API (/volumecontent, the volume's own bearer
// token, no API key) over one host's volume store: Local serves it where
// the volume lives.

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

// entryJSON is a volume entry as the content API answers it.
func entryJSON(e volume.Entry) wire.VolumeEntryStat {
	return wire.VolumeEntryStat{Name: e.Name, Type: e.Type, Path: e.Path, Size: e.Size, Mode: e.Mode, UID: e.UID, GID: e.GID,
		Atime: e.Atime, Mtime: e.Mtime, Ctime: e.Ctime, Target: e.Target}
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

// writeJSON and decode are the REST API's, for the content API's bodies.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// decode reads a JSON body into v; an empty body leaves v as it is.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, MaxBody)
	err := json.NewDecoder(r.Body).Decode(v)
	var mbe *http.MaxBytesError
	switch {
	case err == nil || errors.Is(err, io.EOF):
		return nil
	case errors.As(err, &mbe):
		return fmt.Errorf("request body is larger than %d bytes: %w", MaxBody, errdefs.ErrTooLarge)
	default:
		return errdefs.Invalid("malformed JSON body: %v", err)
	}
}
