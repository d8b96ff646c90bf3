package api

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
)

// lifecycle reads E2B's autoPause, autoPauseMemory (default true) and
// autoResume.enabled.
func lifecycle(r wire.NewSandbox) sandbox.Lifecycle {
	lc := sandbox.Lifecycle{
		AutoPause:  r.AutoPause != nil && *r.AutoPause,
		DropMemory: r.AutoPauseMemory != nil && !*r.AutoPauseMemory,
	}
	if r.AutoResume != nil {
		lc.AutoResume = r.AutoResume.Enabled
	}
	return lc
}

// maxTimeoutSeconds guards the seconds→Duration conversion from overflow.
const maxTimeoutSeconds = 1 << 32

func seconds(v int64, field string) (time.Duration, error) {
	if v < 0 || v > maxTimeoutSeconds {
		return 0, errdefs.Invalid("%s %d is out of range: give a positive number of seconds", field, v)
	}
	return time.Duration(v) * time.Second, nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.NewSandbox
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	cr := sandbox.CreateRequest{
		Template: s.resolveTag(req.TemplateID), Metadata: req.Metadata, EnvVars: req.EnvVars,
		CPUs: req.CPUCount, MemoryMB: req.MemoryMB,
		Network:   toNetwork(req.AllowInternetAccess, req.Network),
		Lifecycle: lifecycle(req),
	}
	mounts, err := s.resolveMounts(r, req.VolumeMounts)
	if err != nil {
		writeError(w, err)
		return
	}
	cr.Volumes = mounts
	if req.Timeout != nil {
		if *req.Timeout <= 0 {
			writeError(w, errdefs.Invalid("timeout %d: give a positive number of seconds", *req.Timeout))
			return
		}
		d, err := seconds(*req.Timeout, "timeout")
		if err != nil {
			writeError(w, err)
			return
		}
		cr.Timeout = d
	}
	sb, err := s.backend(r).Create(r.Context(), cr)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.toJSON(sb, true))
}

// listSandboxes answers GET /v2/sandboxes (paged, see list.go) and the
// v1 GET /sandboxes (the same filters, in one piece, as E2B's v1).
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	lq, err := parseListQuery(r.URL.Query(), strings.HasPrefix(r.URL.Path, "/v2/"))
	if err != nil {
		writeError(w, err)
		return
	}
	list, err := s.backend(r).List(r.Context(), lq.filter)
	if err != nil {
		writeError(w, err)
		return
	}
	p := lq.page(list)
	out := make([]wire.Sandbox, 0, len(p.items))
	for _, sb := range p.items {
		out = append(out, s.toJSON(sb, false))
	}
	if p.next != "" {
		w.Header().Set("X-Next-Token", p.next)
	}
	if slices.Contains(lq.filter.States, sandbox.StateRunning) {
		w.Header().Set("X-Total-Running", strconv.Itoa(p.totalRunning))
	}
	writeJSON(w, http.StatusOK, out)
}

// parseMetadata reads the SDK's metadata filter: a query string of
// key=value pairs whose keys and values are escaped once more.
func parseMetadata(raw string) (map[string]string, error) {
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return nil, errdefs.Invalid("metadata filter %q: want key=value pairs joined with &: %v", raw, err)
	}
	out := map[string]string{}
	for k, vs := range vals {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(vs[0])
		if err1 != nil || err2 != nil {
			return nil, errdefs.Invalid("metadata filter %q is not URL-encoded correctly", raw)
		}
		out[key] = val
	}
	return out, nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.backend(r).Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.toJSON(sb, true))
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request) {
	if err := s.backend(r).Kill(r.Context(), r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req wire.TimeoutRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Timeout == nil {
		writeError(w, errdefs.Invalid("timeout is required: give seconds from now"))
		return
	}
	d, err := seconds(*req.Timeout, "timeout")
	if err != nil {
		writeError(w, err)
		return
	}
	if _, err := s.backend(r).SetTimeout(r.Context(), r.PathValue("id"), d); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connectSandbox is E2B's connect: a paused sandbox is resumed (201), a
// running one's details are returned (200) and its timeout, when given,
// only ever extended. memory: false resumes a sandbox paused without its
// memory (a reboot with its files, as any resume of it).
func (s *Server) connectSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.ConnectRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	var d time.Duration
	if req.Timeout != nil {
		var err error
		if d, err = seconds(*req.Timeout, "timeout"); err != nil {
			writeError(w, err)
			return
		}
	}
	id := r.PathValue("id")
	if req.Memory != nil && !*req.Memory {
		sb, err := s.backend(r).Get(r.Context(), id)
		if err != nil {
			writeError(w, err)
			return
		}
		if sb.State == sandbox.StatePaused {
			writeError(w, errdefs.Invalid("memory: false resumes a sandbox without its memory, and sandbox %s was paused with it: resume it with its memory (leave memory out), or pause it with memory: false", id))
			return
		}
	}
	sb, resumed, err := s.backend(r).Connect(r.Context(), id, d)
	if err != nil {
		writeError(w, err)
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.toJSON(sb, true))
}

func toNetwork(internet *bool, n *wire.Network) *sandbox.Network {
	out := &sandbox.Network{AllowInternet: true}
	if internet != nil {
		out.AllowInternet = *internet
	}
	if n != nil {
		out.AllowOut, out.DenyOut = n.AllowOut, n.DenyOut
		out.PrivateTraffic = n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic
	}
	return out
}

// updateNetwork changes the egress policy of a running sandbox (E2B's
// PUT /sandboxes/{id}/network). Fields left out keep their value.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var req wire.NetworkUpdate
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	sb, err := s.backend(r).Get(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	n := sb.Network
	if req.AllowOut != nil {
		n.AllowOut = *req.AllowOut
	}
	if req.DenyOut != nil {
		n.DenyOut = *req.DenyOut
	}
	if req.AllowInternetAccess != nil {
		n.AllowInternet = *req.AllowInternetAccess
	}
	if _, err := s.backend(r).SetNetwork(r.Context(), id, n); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refreshSandbox is E2B's keep-alive: the sandbox lives at least duration
// seconds (default 60) more; it never shortens its life.
func (s *Server) refreshSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.RefreshRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	d := 60 * time.Second
	if req.Duration != nil {
		var err error
		if d, err = seconds(*req.Duration, "duration"); err != nil {
			writeError(w, err)
			return
		}
	}
	if _, err := s.backend(r).Extend(r.Context(), r.PathValue("id"), d); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
