// Package api serves agentenv's REST API: E2B's sandbox and template routes
// (so the official e2b SDKs work unchanged) plus agentenv's own routes under
// /agentenv/. It maps error classes to HTTP at this edge only and must not
// hold sandbox state of its own. Its JSON bodies are the public package
// github.com/agentenv/agentenv/client/api (imported as wire), which the Go client
// shares; a body shape belongs there, not here.
package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/metrics"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
)

// Config configures the API server.
type Config struct {
	// APIKey is the single key of a server with one user, who sees every
	// sandbox. Either or both of APIKey and APIKeys must be set.
	APIKey string
	// APIKeys maps each named key (--api-keys-file) to its name: such a
	// key sees and controls only the sandboxes and snapshots it made.
	APIKeys map[string]string
	// OperatorKey, if set, is the operator's key: it may do everything
	// an API key may, and the node operations (cordon, uncordon, drain,
	// forget), which no API key may.
	OperatorKey string
	// Backend runs what the routes ask: Local on one host, the fleet's
	// remote backend behind `agentenv api`.
	Backend service.Backend
	// Fleet, if set, serves the node routes (agentenv api); without it
	// they answer that this server is not a fleet.
	Fleet service.Fleet
	// TemplateBuilds, if set, serves E2B's template-in-code builds
	// (/v3/templates and the routes after it); without it they answer 503.
	TemplateBuilds *TemplateBuilds
	// Domain is what clients put after "<port>-<sandboxID>." to reach a
	// sandbox port through the proxy.
	Domain string
	// Metrics, if set, is the role's registry, whose live history the
	// live page (/ui) shows.
	Metrics *metrics.Registry
	Log     *slog.Logger
}

// Server is the REST API.
type Server struct {
	cfg Config
	// Key digests (keys.go).
	single, operator [32]byte
	named            map[[32]byte]string
}

// New returns the API server. CheckKeys tells whether cfg's keys are
// usable.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Server{cfg: cfg, single: keyDigest(cfg.APIKey), operator: keyDigest(cfg.OperatorKey), named: map[[32]byte]string{}}
	for k, name := range cfg.APIKeys {
		s.named[keyDigest(k)] = name
	}
	return s
}

// Handler returns the HTTP handler with every route.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	auth := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, s.auth(h)) }
	auth("POST /sandboxes", s.createSandbox)
	auth("POST /v2/sandboxes", s.createSandbox)
	auth("GET /sandboxes", s.listSandboxes)
	auth("GET /v2/sandboxes", s.listSandboxes)
	auth("GET /sandboxes/{id}", s.getSandbox)
	auth("DELETE /sandboxes/{id}", s.killSandbox)
	auth("POST /sandboxes/{id}/timeout", s.setTimeout)
	auth("POST /v2/sandboxes/{id}/connect", s.connectSandbox)
	auth("POST /sandboxes/{id}/connect", s.connectSandbox)
	auth("PUT /sandboxes/{id}/network", s.updateNetwork)
	auth("POST /sandboxes/{id}/refreshes", s.refreshSandbox)
	auth("GET /sandboxes/{id}/metrics", s.sandboxMetrics)
	auth("GET /sandboxes/metrics", s.sandboxesMetrics)
	auth("POST /sandboxes/{id}/pause", s.pauseSandbox)
	auth("POST /sandboxes/{id}/resume", s.resumeSandbox)
	auth("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	auth("POST /sandboxes/{id}/fork", s.forkSandbox)
	auth("GET /snapshots", s.listSnapshots)
	auth("GET /snapshots/{id}", s.getSnapshot)
	auth("DELETE /snapshots/{id}", s.deleteSnapshot)
	auth("GET /templates", s.listTemplates)
	auth("GET /templates/{name}", s.getTemplate)
	auth("DELETE /templates/{name}", s.deleteTemplate)
	auth("POST /agentenv/templates", s.buildTemplate)
	auth("POST /agentenv/templates/{name}/rootfs", s.uploadTemplate)
	auth("GET /agentenv/nodes", s.listNodes)
	s.volumeRoutes(mux, auth)
	s.stepBuildRoutes(mux, auth)
	mux.HandleFunc("GET /ui", s.uiPage)
	auth("GET /ui/data", s.uiData)
	mux.Handle("POST /agentenv/nodes/{name}/{action}", s.operatorOnly(s.nodeAction))
	mux.Handle("/", s.auth(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errdefs.NotFound("no route %s %s (see api/openapi.yaml)", r.Method, r.URL.Path))
	}))
	return s.logRequests(mux)
}

func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rw := &statusWriter{ResponseWriter: w, status: 200}
		next.ServeHTTP(rw, r)
		s.cfg.Log.Debug("api request", "method", r.Method, "path", r.URL.Path, "status", rw.status, "took", time.Since(start))
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }

// Unwrap lets http.ResponseController reach the connection (full duplex
// for uploads).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// auth checks the API key (X-API-Key, as E2B; or a Bearer token).
func (s *Server) auth(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := s.caller(r)
		if err != nil {
			writeError(w, err)
			return
		}
		next(w, r.WithContext(withIdentity(r.Context(), id)))
	})
}

// operatorOnly serves a route only to the operator's key (node
// operations): an API key drives sandboxes, templates and snapshots, and
// nothing that changes the fleet itself.
func (s *Server) operatorOnly(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := s.caller(r)
		if err == nil && !id.Operator {
			err = fmt.Errorf("node operations need the operator key (X-API-Key: the key of `agentenv api --operator-key-file`; the CLI reads AGENTENV_OPERATOR_KEY), not an API key: %w", errdefs.ErrPermissionDenied)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		next(w, r.WithContext(withIdentity(r.Context(), id)))
	})
}

func writeError(w http.ResponseWriter, err error) {
	status, code := errdefs.HTTPStatus(err)
	if errdefs.Retryable(err) {
		// The same request may succeed in a moment (503, 429): say when.
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, wire.Error{Status: status, ErrorCode: code, Message: err.Error(), EndCause: sandbox.EndCause(err)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// decode reads a JSON body into v; an empty body leaves v as it is.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, service.MaxBody)
	dec := json.NewDecoder(r.Body)
	err := dec.Decode(v)
	var mbe *http.MaxBytesError
	switch {
	case err == nil || errors.Is(err, io.EOF):
		return nil
	case errors.As(err, &mbe):
		return fmt.Errorf("request body is larger than %d bytes: %w", service.MaxBody, errdefs.ErrTooLarge)
	default:
		return errdefs.Invalid("malformed JSON body: %v", err)
	}
}

// toBoot is a sandbox's boot record as the API shows it (milliseconds).
func toBoot(r *sandbox.BootRecord) *wire.BootRecord {
	if r == nil {
		return nil
	}
	out := &wire.BootRecord{Kind: r.Kind, Steps: make([]wire.BootStep, 0, len(r.Steps))}
	for _, s := range r.Steps {
		st := wire.BootStep{Step: s.Step, WallMs: ms(s.Wall)}
		if s.CPU != nil {
			c := ms(*s.CPU)
			st.CPUMs = &c
		}
		out.Steps = append(out.Steps, st)
	}
	return out
}

// toJSON is a sandbox as the API shows it; withToken adds its tokens
// (create, connect and get; not lists).
func (s *Server) toJSON(sb sandbox.Sandbox, withToken bool) wire.Sandbox {
	out := wire.Sandbox{
		SandboxID: sb.ID, TemplateID: sb.Template, Alias: sb.Template, ClientID: "agentenv",
		EnvdVersion: envdapi.Version, StartedAt: sb.StartedAt, EndAt: sb.EndAt,
		CPUCount: sb.CPUs, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB, Metadata: sb.Metadata, State: string(sb.State.E2B()),
		AllowInternetAccess: sb.Network.AllowInternet, SnapshotID: sb.Snapshot, ParentSandboxID: sb.Parent,
	}
	if len(sb.Network.AllowOut)+len(sb.Network.DenyOut) > 0 || sb.Network.PrivateTraffic {
		public := !sb.Network.PrivateTraffic
		out.Network = &wire.Network{AllowOut: sb.Network.AllowOut, DenyOut: sb.Network.DenyOut, AllowPublicTraffic: &public}
	}
	out.Lifecycle = &wire.Lifecycle{AutoResume: sb.Lifecycle.AutoResume, OnTimeout: "kill"}
	if sb.Lifecycle.AutoPause {
		out.Lifecycle.OnTimeout = "pause"
	}
	for _, v := range sb.Volumes {
		out.VolumeMounts = append(out.VolumeMounts, wire.VolumeMount{Name: v.Name, Path: v.Path})
	}
	if s.cfg.Domain != "" {
		d := s.cfg.Domain
		out.Domain = &d
	}
	if withToken {
		out.EnvdAccessToken = sb.AccessToken
		out.TrafficAccessToken = sb.TrafficToken
		out.Boot = toBoot(sb.Boot)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
