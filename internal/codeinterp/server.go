// Package codeinterp is the code interpreter server of the
// code-interpreter-v1 template: the HTTP API on port 49999 that E2B's
// code interpreter SDKs call (POST /execute streaming newline-delimited
// JSON, /contexts, GET /health), backed by real IPython kernels
// (ipykernel) spoken to over ZeroMQ with Jupyter's messaging protocol.
// Each context is its own kernel with its own working directory.
//
// It runs inside a sandbox as the template's start command, as the
// sandbox's default user; it must not run on the host.
package codeinterp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	_ "embed"
)

// Port is where E2B's SDKs reach the code interpreter.
const Port = 49999

// Config configures a Server.
type Config struct {
	// Python runs the kernels (default python3).
	Python string
	// StateDir holds each kernel's connection file, sockets and log, and
	// the IPython profile the kernels use (default: a directory in /tmp).
	StateDir string
	// Cwd is the working directory of a context that names none (default:
	// the user's home directory).
	Cwd string
	// EnvdURL is envd's address inside the sandbox, asked for the
	// sandbox's environment variables (GET /envs) before a context's
	// first cell; empty: not asked.
	EnvdURL string
	Log     *slog.Logger
}

//go:embed startup.py
var startupPy []byte

// kernelConfigPy is the kernels' IPython configuration: tracebacks
// without terminal colours, as a client shows them as plain text.
const kernelConfigPy = "c = get_config()\nc.InteractiveShell.colors = 'NoColor'\n"

// codeContext is one context: a kernel, its language and cwd.
type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	k *kernel
	// envLoaded says the sandbox's variables were set in the kernel.
	envLoaded bool
}

// Server serves the code interpreter API.
type Server struct {
	cfg   Config
	ready chan struct{}

	mu       sync.Mutex
	contexts map[string]*codeContext
	defaults map[string]string // language → its default context
}

// New makes a Server; Start starts its default Python context.
func New(cfg Config) (*Server, error) {
	if cfg.Python == "" {
		cfg.Python = "python3"
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Cwd == "" {
		cfg.Cwd, _ = os.UserHomeDir()
		if cfg.Cwd == "" {
			cfg.Cwd = "/"
		}
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(os.TempDir(), fmt.Sprintf("codeinterp-%d", os.Getuid()))
	}
	profile := filepath.Join(cfg.StateDir, "ipython", "profile_default")
	if err := os.MkdirAll(filepath.Join(profile, "startup"), 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(profile, "startup", "00-codeinterp.py"), startupPy, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(profile, "ipython_kernel_config.py"), []byte(kernelConfigPy), 0o600); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, ready: make(chan struct{}), contexts: map[string]*codeContext{}, defaults: map[string]string{}}, nil
}

// Start starts the default Python context; /health answers 200 after it.
func (s *Server) Start(ctx context.Context) error {
	if _, err := s.defaultContext(ctx, "python"); err != nil {
		return err
	}
	close(s.ready)
	return nil
}

// Close stops every kernel.
func (s *Server) Close() {
	s.mu.Lock()
	cs := make([]*codeContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		cs = append(cs, c)
	}
	s.contexts = map[string]*codeContext{}
	s.mu.Unlock()
	for _, c := range cs {
		c.k.close()
	}
}

// normalizeLanguage gives a request's language as E2B names it.
func normalizeLanguage(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "", "python3", "py":
		return "python"
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	}
	return l
}

// newContext starts a kernel for language in cwd.
func (s *Server) newContext(ctx context.Context, language, cwd string) (*codeContext, error) {
	if language != "python" {
		return nil, fmt.Errorf("%w: language %q: this template's code interpreter runs python only", errInvalid, language)
	}
	if !filepath.IsAbs(cwd) {
		return nil, fmt.Errorf("%w: cwd %q: give an absolute path", errInvalid, cwd)
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%w: cwd %q is not a directory in the sandbox: create it first", errInvalid, cwd)
	}
	id := newID()
	env := append(os.Environ(), "IPYTHONDIR="+filepath.Join(s.cfg.StateDir, "ipython"))
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	k, err := startKernel(sctx, kernelConfig{Python: s.cfg.Python, Dir: filepath.Join(s.cfg.StateDir, "kernels", id), Cwd: cwd, Env: env})
	if err != nil {
		return nil, err
	}
	c := &codeContext{ID: id, Language: language, Cwd: cwd, k: k}
	s.mu.Lock()
	s.contexts[id] = c
	s.mu.Unlock()
	s.cfg.Log.Info("context started", "context", id, "language", language, "cwd", cwd)
	return c, nil
}

// defaultContext returns the language's default context, starting it once.
func (s *Server) defaultContext(ctx context.Context, language string) (*codeContext, error) {
	s.mu.Lock()
	if c := s.contexts[s.defaults[language]]; c != nil {
		s.mu.Unlock()
		return c, nil
	}
	s.mu.Unlock()
	c, err := s.newContext(ctx, language, s.cfg.Cwd)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if other := s.contexts[s.defaults[language]]; other != nil {
		// Another request started it meanwhile: keep that one.
		delete(s.contexts, c.ID)
		go c.k.close()
		return other, nil
	}
	s.defaults[language] = c.ID
	return c, nil
}

var (
	errInvalid  = errors.New("invalid request")
	errNotFound = errors.New("not found")
)

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("POST /execute", s.execute)
	mux.HandleFunc("POST /contexts", s.createContext)
	mux.HandleFunc("GET /contexts", s.listContexts)
	mux.HandleFunc("DELETE /contexts/{id}", s.removeContext)
	mux.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	return mux
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.ready:
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`"OK"`))
	default:
		http.Error(w, "the default python context is starting", http.StatusServiceUnavailable)
	}
}

func httpError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, errInvalid):
		code = http.StatusBadRequest
	case errors.Is(err, errNotFound):
		code = http.StatusNotFound
	}
	http.Error(w, err.Error(), code)
}

func (s *Server) lookup(id string) (*codeContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.contexts[id]
	if c == nil {
		return nil, fmt.Errorf("%w: context %s not found (list them with GET /contexts)", errNotFound, id)
	}
	return c, nil
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decodeBody(r, &req); err != nil {
		httpError(w, err)
		return
	}
	if req.Cwd == "" {
		req.Cwd = s.cfg.Cwd
	}
	c, err := s.newContext(r.Context(), normalizeLanguage(req.Language), req.Cwd)
	if err != nil {
		httpError(w, err)
		return
	}
	writeJSON(w, c)
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	cs := make([]*codeContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	sort.Slice(cs, func(i, j int) bool { return cs[i].ID < cs[j].ID })
	writeJSON(w, cs)
}

func (s *Server) removeContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	c := s.contexts[id]
	delete(s.contexts, id)
	for l, d := range s.defaults {
		if d == id {
			delete(s.defaults, l)
		}
	}
	s.mu.Unlock()
	if c == nil {
		httpError(w, fmt.Errorf("%w: context %s not found", errNotFound, id))
		return
	}
	c.k.close()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		httpError(w, err)
		return
	}
	// A running cell is interrupted, then the kernel replaced.
	c.k.interrupt()
	if err := c.k.acquire(r.Context()); err != nil {
		httpError(w, err)
		return
	}
	defer c.k.release()
	if err := c.k.restart(context.WithoutCancel(r.Context())); err != nil {
		httpError(w, fmt.Errorf("restart context %s: %w", c.ID, err))
		return
	}
	c.envLoaded = false
	w.WriteHeader(http.StatusNoContent)
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<20))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: body: %v (send a JSON object)", errInvalid, err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
