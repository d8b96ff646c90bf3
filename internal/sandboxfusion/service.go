// Package sandboxfusion serves SandboxFusion's code-execution API
// (POST /run_code, POST /run_jupyter, GET /v1/ping) over agentenv's
// sandboxes, so code written for SandboxFusion (verl's code reward and
// tools) runs here by changing a URL.
//
// Every call runs in a sandbox of its own, created for it from the runner
// template and killed after it: nothing a call writes, starts or opens
// survives into another call. Sandboxes are created ahead into a small
// pool so a call does not wait for a boot. The package reaches sandboxes
// only through the API's backend (create, kill, templates) and envd
// through the sandbox proxy, so it runs the same beside `agentenv serve`
// and `agentenv api`. It must not hold a sandbox across calls.
package sandboxfusion

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// DefaultTemplate is the runner template's name: built from
// RunnerPackages when missing.
const DefaultTemplate = "sandboxfusion"

// Sandboxes is what the service needs of the API's backend
// (internal/service.Backend has these methods).
type Sandboxes interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	Kill(ctx context.Context, id string) error
	GetTemplate(ctx context.Context, name string) (service.TemplateInfo, error)
	BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (service.TemplateInfo, error)
}

var _ Sandboxes = service.Backend(nil)

// Config configures the service.
type Config struct {
	// Listen is the address to serve on; off loopback it needs Key.
	Listen string
	// Key, when set, must come with every call: header X-API-Key,
	// Authorization: Bearer, or as the first path element
	// (/KEY/run_code), for clients that can only set a URL.
	Key string
	// Template is the runner template (DefaultTemplate when empty). The
	// default one is built when missing; another name must exist.
	Template string
	// Pool is how many sandboxes are kept created ahead (0: none).
	Pool int
	// MaxConcurrent is how many calls run at once; more wait.
	MaxConcurrent int
	// MemoryMB is the memory of a pooled sandbox; a call asking more
	// gets a sandbox of its own size.
	MemoryMB int
	// Ready, if set, is called with the bound address once it serves.
	Ready func(addr string)
}

// memoryHeadroomMB is what a sandbox has beyond the call's limit: envd,
// the shell and the page cache of the toolchain.
const memoryHeadroomMB = 256

// Check says what is wrong with cfg, before anything is started.
func (cfg Config) Check() error {
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return errdefs.Invalid("--sandboxfusion-listen %q: give HOST:PORT (127.0.0.1:8080)", cfg.Listen)
	}
	if !isLoopback(host) && cfg.Key == "" {
		return errdefs.Invalid("--sandboxfusion-listen %s is off loopback: set --sandboxfusion-key (clients send it as header X-API-Key or in the URL, http://HOST:PORT/KEY/run_code), or listen on 127.0.0.1", cfg.Listen)
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Service runs SandboxFusion calls.
type Service struct {
	cfg   Config
	boxes Sandboxes
	envd  *client.Client
	log   *slog.Logger
	slots chan struct{}
	pool  *pool

	done chan struct{} // closed when prepare has returned

	mu       sync.Mutex
	building error // not nil while the runner template is not ready
}

// New returns a service creating sandboxes through boxes and reaching
// envd through the sandbox proxy at proxyURL. It starts filling its pool
// (and building the default runner template when missing) in the
// background until ctx ends.
func New(ctx context.Context, cfg Config, boxes Sandboxes, proxyURL string, log *slog.Logger) *Service {
	if cfg.Template == "" {
		cfg.Template = DefaultTemplate
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 16
	}
	if cfg.MemoryMB <= 0 {
		cfg.MemoryMB = 1024 + memoryHeadroomMB
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Service{cfg: cfg, boxes: boxes, log: log,
		envd:  client.New("", proxyURL, ""),
		slots: make(chan struct{}, cfg.MaxConcurrent), done: make(chan struct{})}
	s.pool = newPool(cfg.Pool, cfg.MemoryMB, s.create, s.kill, log)
	s.building = errdefs.Unavailable("the runner template %q is being checked: retry in a moment", cfg.Template)
	go s.prepare(ctx)
	return s
}

// prepare makes sure the runner template exists, then fills the pool.
func (s *Service) prepare(ctx context.Context) {
	defer close(s.done)
	err := s.ensureTemplate(ctx)
	s.mu.Lock()
	s.building = err
	s.mu.Unlock()
	if err != nil {
		s.log.Error("sandboxfusion: runner template not ready", "template", s.cfg.Template, "err", err)
		return
	}
	s.pool.run(ctx)
}

func (s *Service) ensureTemplate(ctx context.Context) error {
	_, err := s.boxes.GetTemplate(ctx, s.cfg.Template)
	if err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if s.cfg.Template != DefaultTemplate {
		return fmt.Errorf("runner template %q does not exist: build it (agentenv template build %s --debian bookworm --packages %s) or leave --sandboxfusion-template out: %w",
			s.cfg.Template, s.cfg.Template, strings.Join(RunnerPackages, ","), errdefs.ErrNotFound)
	}
	s.mu.Lock()
	s.building = errdefs.Unavailable("the runner template %q is being built (Debian bookworm with %s; a few minutes, once): retry then", s.cfg.Template, strings.Join(RunnerPackages, ", "))
	s.mu.Unlock()
	s.log.Info("sandboxfusion: building the runner template", "template", s.cfg.Template, "packages", RunnerPackages)
	start := time.Now()
	phase := ""
	_, err = s.boxes.BuildTemplate(ctx, template.BuildRequest{Name: s.cfg.Template, Debian: "bookworm", Packages: RunnerPackages}, func(p template.Progress) {
		if p.Phase != phase {
			phase = p.Phase
			s.log.Info("sandboxfusion: runner template build", "phase", p.Phase)
		}
	})
	if err != nil {
		return fmt.Errorf("build the runner template %q: %w", s.cfg.Template, err)
	}
	s.log.Info("sandboxfusion: runner template built", "template", s.cfg.Template, "took", time.Since(start).Round(time.Second))
	return nil
}

// ready says why calls cannot run yet, or nil.
func (s *Service) ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.building
}

// create makes a runner sandbox of memMB without network; it lives life
// at most.
func (s *Service) create(ctx context.Context, memMB int, life time.Duration) (client.Sandbox, error) {
	sb, err := s.boxes.Create(ctx, sandbox.CreateRequest{
		Template: s.cfg.Template, MemoryMB: memMB, Timeout: life,
		Network:  &sandbox.Network{PrivateTraffic: true},
		Metadata: map[string]string{"agentenv.sandboxfusion": "runner"},
	})
	if err != nil {
		return client.Sandbox{}, err
	}
	return client.Sandbox{SandboxID: sb.ID, EnvdAccessToken: sb.AccessToken}, nil
}

// kill ends a call's sandbox, whatever happened to the call.
func (s *Service) kill(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.boxes.Kill(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Warn("sandboxfusion: kill a runner sandbox", "sandbox", id, "err", err)
	}
}

// Handler serves the API.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/ping", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, "pong") })
	mux.HandleFunc("POST /run_code", s.serveRunCode)
	mux.HandleFunc("POST /run_jupyter", s.serveRunJupyter)
	return s.auth(mux)
}

// auth checks the key, from a header or the first path element (which it
// strips).
func (s *Service) auth(next http.Handler) http.Handler {
	if s.cfg.Key == "" {
		return next
	}
	key := []byte(s.cfg.Key)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("X-API-Key")
		if got == "" {
			got, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		}
		if got != "" && subtle.ConstantTimeCompare([]byte(got), key) == 1 {
			next.ServeHTTP(w, r)
			return
		}
		if first, rest, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/"); ok && subtle.ConstantTimeCompare([]byte(first), key) == 1 {
			r2 := r.Clone(r.Context())
			r2.URL.Path = "/" + rest
			r2.URL.RawPath = ""
			next.ServeHTTP(w, r2)
			return
		}
		writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "this SandboxFusion service needs its key: send header X-API-Key (or Authorization: Bearer), or put it in the URL: http://HOST:PORT/KEY/run_code"})
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// decode reads a JSON body of at most maxBody bytes into v, answering 422
// (SandboxFusion's status for a body it cannot validate) when it is bad.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(v); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"detail": "the request body is not valid JSON of this route's shape: " + err.Error()})
		return false
	}
	return true
}

// maxBody bounds a request: code and base64 files.
const maxBody = 64 << 20

// Wait returns once the service's background work has stopped (after
// New's ctx ended) and its pooled sandboxes are killed.
func (s *Service) Wait() { <-s.done }

// Template is the runner template's name.
func (s *Service) Template() string { return s.cfg.Template }
