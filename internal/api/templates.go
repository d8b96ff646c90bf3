package api

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// toTemplateJSON is a template as the API shows it (E2B's Template shape
// plus agentenv's fields).
func toTemplateJSON(ti service.TemplateInfo) wire.Template {
	t := ti.Template
	// A template whose build gave no size shows E2B's defaults; its
	// sandboxes get the server's (--default-cpus, --default-memory-mb).
	cpus, mem := 2, 512
	if t.CPUs > 0 {
		cpus = t.CPUs
	}
	if t.MemoryMB > 0 {
		mem = t.MemoryMB
	}
	return wire.Template{Ready: ti.Ready,
		TemplateID: t.Name, BuildID: t.EnvdHash, Aliases: []string{t.Name}, CPUCount: cpus, MemoryMB: mem,
		CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt, Source: t.Source, Packages: t.Packages,
		ImageSize: t.ImageSize, InUse: t.InUse, DiskSizeMB: t.DiskMB,
		OwnBytes: t.OwnBytes, SharedBytes: t.SharedBytes, Layers: 1 + len(t.Lowers),
		TemplateSettings: wire.TemplateSettings{Env: t.Env, Workdir: t.Workdir, User: t.User,
			StartCmd: t.StartCmd, ReadyCmd: t.ReadyCmd, ReadyTimeout: t.ReadyTimeout},
	}
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	list, err := s.backend(r).ListTemplates(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := []wire.Template{}
	for _, t := range list {
		out = append(out, toTemplateJSON(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.backend(r).GetTemplate(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toTemplateJSON(t))
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if err := s.backend(r).DeleteTemplate(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, err)
		return
	}
	if tb := s.cfg.TemplateBuilds; tb != nil {
		// Its uploaded COPY files and tags go with it.
		if err := tb.files.remove(r.PathValue("name")); err != nil {
			s.cfg.Log.Warn("remove a deleted template's build files", "template", r.PathValue("name"), "err", err)
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// buildTemplate builds a template and streams progress as NDJSON. Input
// errors are answered with a plain 4xx before the stream starts.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	var req wire.BuildRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	ts := req.TemplateSettings
	s.streamBuild(w, r, template.BuildRequest{Name: req.Name, Debian: req.Debian, Packages: req.Packages,
		Mirror: req.Mirror, Rootfs: req.Rootfs, Busybox: req.Busybox, DiskMB: req.DiskMB,
		Defaults: template.Defaults{Env: ts.Env, Workdir: ts.Workdir, User: ts.User},
		Start:    template.Start{StartCmd: ts.StartCmd, ReadyCmd: ts.ReadyCmd, ReadyTimeout: ts.ReadyTimeout},
		Size:     template.Size{CPUs: req.CPUCount, MemoryMB: req.MemoryMB}, CodeInterpreter: req.CodeInterpreter})
}

// uploadTemplate builds a template from a rootfs tarball (plain or gzip)
// sent as the request body, streaming progress as buildTemplate does.
func (s *Server) uploadTemplate(w http.ResponseWriter, r *http.Request) {
	// The body is read while progress is written: Go's HTTP/1 server would
	// otherwise close it at the first response write.
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		writeError(w, err)
		return
	}
	// Read what the tar reader left (tar's end padding: Python's tarfile
	// pads to 10 KiB) before returning: drained later by the server, the
	// body's EOF starts a background read that the next request's read
	// on the same connection panics on.
	defer io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	req, err := uploadRequest(r)
	if err != nil {
		writeError(w, err)
		return
	}
	s.streamBuild(w, r, req)
}

// uploadRequest reads an upload's settings from its query: image (the
// label of the OCI image it was flattened from), env (KEY=VALUE, repeated),
// workdir, user, startCmd, readyCmd, readyTimeout (seconds), diskMB,
// cpuCount, memoryMB.
func uploadRequest(r *http.Request) (template.BuildRequest, error) {
	q := r.URL.Query()
	req := template.BuildRequest{Name: r.PathValue("name"), Upload: r.Body, Image: q.Get("image"),
		Defaults: template.Defaults{Workdir: q.Get("workdir"), User: q.Get("user")},
		Start:    template.Start{StartCmd: q.Get("startCmd"), ReadyCmd: q.Get("readyCmd")}}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return req, errdefs.Invalid("env %q: give KEY=VALUE", kv)
		}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	if t := q.Get("readyTimeout"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil {
			return req, errdefs.Invalid("readyTimeout %q: give whole seconds", t)
		}
		req.ReadyTimeout = n
	}
	for _, f := range []struct {
		name, unit string
		to         *int
	}{{"diskMB", "MiB", &req.DiskMB}, {"cpuCount", "CPUs", &req.CPUs}, {"memoryMB", "MiB", &req.MemoryMB}} {
		if v := q.Get(f.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return req, errdefs.Invalid("%s %q is not a whole number of %s", f.name, v, f.unit)
			}
			*f.to = n
		}
	}
	return req, nil
}

// streamBuild answers an invalid request with a plain 4xx; once the build
// reports progress, the answer is a 200 stream ending in the template or
// an error line.
func (s *Server) streamBuild(w http.ResponseWriter, r *http.Request, req template.BuildRequest) {
	enc := json.NewEncoder(w)
	flusher, _ := w.(http.Flusher)
	started := false
	var last template.Progress
	emit := func(ev wire.BuildEvent) {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		enc.Encode(ev)
		if flusher != nil {
			flusher.Flush()
		}
	}
	t, err := s.backend(r).BuildTemplate(r.Context(), req, func(p template.Progress) {
		// Skip repeats of the same whole percent to keep the stream small.
		if started && p.Phase == last.Phase && int(p.Percent) == int(last.Percent) && !strings.HasPrefix(p.Message, "Configuring") {
			return
		}
		last = p
		emit(wire.BuildEvent{Progress: &wire.BuildProgress{Phase: p.Phase, Percent: p.Percent, Message: p.Message}})
	})
	switch {
	case err != nil && !started:
		writeError(w, err)
	case err != nil:
		status, code := errdefs.HTTPStatus(err)
		emit(wire.BuildEvent{Error: &wire.Error{Status: status, ErrorCode: code, Message: err.Error()}})
	default:
		tj := toTemplateJSON(t)
		emit(wire.BuildEvent{Template: &tj})
	}
}
