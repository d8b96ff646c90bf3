// Package envd is the daemon that runs inside every sandbox. It speaks E2B
// envd's protocol: Connect-RPC process.Process and filesystem.Filesystem,
// and REST /health, /files, /init. It runs as the sandbox's init process.
// For the host it also saves and restores the sandbox's changed files
// (ChangesPath), so a pause without memory never runs a tool of the
// sandbox's filesystem.
//
// It must stay small and static: no cgo, and only the standard library,
// Connect and protobuf as dependencies (a test enforces this).
package envd

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/agentenv/agentenv/client/api/envd/filesystempb/filesystempbconnect"
	"github.com/agentenv/agentenv/client/api/envd/processpb/processpbconnect"
	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/envdapi/envdauth"
)

// What envd shares with the host (internal/envdapi), under envd's names.
const (
	Port     = envdapi.Port
	Version  = envdapi.Version
	TokenEnv = envdapi.TokenEnv
)

// Config configures the daemon.
type Config struct {
	AccessToken string
	// Envs are the sandbox's environment variables, passed to every command.
	Envs map[string]string
	// MaxUpload caps one POST /files body in bytes (0: 1 GiB).
	MaxUpload int64
	// DefaultUser and DefaultWorkdir are the template's defaults for
	// requests that name no user or working directory (empty: "user" and
	// the user's home). They are process-wide: one envd runs per sandbox.
	DefaultUser, DefaultWorkdir string
	// ChangesRoot is the tree a pause without memory saves and restores
	// (empty: "/", the sandbox's root). The unprivileged test tier, whose
	// envd runs on the host, points it at the sandbox's own directory.
	ChangesRoot string
	// Guard, when not nil, is the sandbox's memory guard: a command whose
	// process group lost a process to it ends as out of memory.
	Guard *MemoryGuard
}

// Server is the daemon.
type Server struct {
	mu        sync.Mutex
	token     string
	envs      map[string]string
	maxUpload int64
	procs     *processService
	// changesRoot is the tree ChangesPath saves and restores: "/" (tests
	// point it at a directory).
	changesRoot string
	guard       *MemoryGuard
}

// New returns a daemon.
func New(cfg Config) *Server {
	if cfg.MaxUpload <= 0 {
		cfg.MaxUpload = 1 << 30
	}
	if cfg.ChangesRoot == "" {
		cfg.ChangesRoot = "/"
	}
	s := &Server{token: cfg.AccessToken, envs: map[string]string{}, maxUpload: cfg.MaxUpload, changesRoot: cfg.ChangesRoot, guard: cfg.Guard}
	for k, v := range cfg.Envs {
		s.envs[k] = v
	}
	s.procs = newProcessService(s)
	setDefaults(cfg.DefaultUser, cfg.DefaultWorkdir)
	return s
}

// Handler returns the daemon's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	path, h := processpbconnect.NewProcessHandler(s.procs)
	mux.Handle(path, s.auth(h))
	fsSvc := &filesystemService{watchers: &watcherSet{m: map[string]*watch{}}}
	path, h = filesystempbconnect.NewFilesystemHandler(fsSvc)
	mux.Handle(path, s.auth(h))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.Handle("GET /files", s.auth(http.HandlerFunc(s.getFile)))
	mux.Handle("POST /files", s.auth(http.HandlerFunc(s.postFiles)))
	mux.Handle("POST /init", s.auth(http.HandlerFunc(s.init)))
	mux.Handle("GET /envs", s.auth(http.HandlerFunc(s.getEnvs)))
	mux.Handle("GET "+ChangesPath, s.auth(http.HandlerFunc(s.getChanges)))
	mux.Handle("POST "+ChangesPath, s.auth(http.HandlerFunc(s.postChanges)))
	return mux
}

// auth enforces the access token (X-Access-Token), when one is set.
// Refusals carry E2B envd's texts: clients tell the cases apart by them.
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		token := s.token
		s.mu.Unlock()
		if msg := envdauth.Refusal(r, token); msg != "" {
			writeError(w, http.StatusUnauthorized, msg)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (s *Server) init(w http.ResponseWriter, r *http.Request) {
	var req struct {
		EnvVars     map[string]string `json:"envVars"`
		AccessToken *string           `json:"accessToken"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "malformed JSON body: "+err.Error())
		return
	}
	s.mu.Lock()
	for k, v := range req.EnvVars {
		s.envs[k] = v
	}
	if req.AccessToken != nil {
		s.token = *req.AccessToken
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) getEnvs(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, http.StatusOK, s.envs)
}

// fileUser resolves the user of a /files request (query "username").
func fileUser(r *http.Request) (account, error) {
	name := r.URL.Query().Get("username")
	if name == "" {
		name = userFromHeader(r.Header)
	}
	return lookupUser(name)
}

// writeFileError answers with the error of a user's file operation (op on
// path): its HTTP status (otherwise when none fits better), and a message
// that says what failed.
func writeFileError(w http.ResponseWriter, err error, a account, op, path string, otherwise int) {
	status, msg := fileStatus(err, a, op, path, otherwise)
	writeError(w, status, msg)
}

func fileStatus(err error, a account, op, path string, otherwise int) (int, string) {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("upload larger than the limit of %d bytes: split it into smaller files", mbe.Limit)
	case errors.Is(err, errNUL):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, fs.ErrPermission):
		return http.StatusForbidden, deniedMessage(err, a, op, path)
	case errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound, fmt.Sprintf("path %q does not exist", path)
	case errors.Is(err, syscall.ENOSPC):
		return http.StatusInsufficientStorage, "not enough space in the sandbox: " + err.Error()
	case errors.Is(err, errIsDir):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, syscall.ENOTDIR):
		var pe *fs.PathError
		if errors.As(err, &pe) {
			path = pe.Path
		}
		return http.StatusBadRequest, fmt.Sprintf("path %q is not a directory", path)
	}
	return otherwise, fmt.Sprintf("%s %q as user %q: %v", op, path, a.Name, err)
}

var errIsDir = errors.New("is a directory, not a file")

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	acct, err := fileUser(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	path, err := resolvePath(r.URL.Query().Get("path"), acct)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	f, err := os.Open(path)
	if err != nil {
		writeFileError(w, err, acct, "read", path, http.StatusInternalServerError)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.IsDir() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path %q is a directory, not a file", path))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(path)}))
	if !st.Mode().IsRegular() || st.Size() == 0 {
		// /proc and /sys files report size 0 and may not seek; a FIFO
		// or device has no size: stream what a read gives (no ranges).
		io.Copy(w, f)
		return
	}
	http.ServeContent(w, r, "", st.ModTime(), f)
}

type entry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
	// Metadata is what the upload stored (X-Metadata-* headers).
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (s *Server) postFiles(w http.ResponseWriter, r *http.Request) {
	acct, err := fileUser(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.maxUpload)
	target := r.URL.Query().Get("path")
	md := metadataFromHeaders(r.Header)
	if err := validateMetadata(md); err != nil {
		writeError(w, http.StatusBadRequest, "invalid metadata: "+err.Error())
		return
	}
	var written []entry
	write := func(p string, body io.Reader) bool {
		path, err := resolvePath(p, acct)
		var stored map[string]string
		if err == nil {
			stored, err = writeFileAs(path, body, acct, md)
		}
		if err != nil {
			// Most other failures are the body's (malformed gzip...).
			writeFileError(w, err, acct, "write", path, http.StatusBadRequest)
			return false
		}
		written = append(written, entry{Name: filepath.Base(path), Type: "file", Path: path, Metadata: stored})
		return true
	}
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == "multipart/form-data" {
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeFileError(w, err, acct, "read the upload for", target, http.StatusBadRequest)
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			p := target
			if p == "" {
				// The SDK puts the whole destination path in the file name;
				// Part.FileName would keep only its last element.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				p = dp["filename"]
			}
			if p == "" {
				writeError(w, http.StatusBadRequest, "no path: give ?path= or a file name in the multipart part")
				return
			}
			ok := write(p, part)
			part.Close()
			if !ok {
				return
			}
		}
	} else {
		if target == "" {
			writeError(w, http.StatusBadRequest, "no path: give ?path=")
			return
		}
		var body io.Reader = r.Body
		if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				writeError(w, http.StatusBadRequest, "body is not valid gzip: "+err.Error())
				return
			}
			defer zr.Close()
			body = zr
		}
		if !write(target, body) {
			return
		}
	}
	writeJSON(w, http.StatusOK, written)
}

// writeFileAs writes r to path in place (created or truncated) for user a,
// as E2B's envd does: envd acts as root and hands ownership to the user.
// Missing parent directories are made and become the user's (even under
// "/"); an existing file becomes the user's before it is truncated, a new
// one right after it is created, so a watcher sees what E2B's shows: a
// new file's CREATE, CHMOD, WRITE; an existing file's CHMOD, WRITE. The
// metadata replaces any the file had. It returns the metadata the file now
// has: md, or none on a filesystem without xattrs.
func writeFileAs(path string, r io.Reader, a account, md map[string]string) (map[string]string, error) {
	if err := ensureDirs(filepath.Dir(path), a); err != nil {
		return nil, err
	}
	f, created, err := openForUpload(path, a)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		f.Close()
		// A refused upload (too large, broken body) leaves no new file
		// behind; a file it overwrote keeps what was written, as in E2B.
		if !ok && created {
			os.Remove(path)
		}
	}()
	if _, err := io.Copy(f, r); err != nil {
		return nil, err
	}
	// A filesystem without xattrs (/proc, /sys) keeps the data without the
	// metadata, as in E2B; the answer then claims none.
	stored := md
	if !created || len(md) > 0 {
		if err := writeMetadata(f, md, created); xattrUnsupported(err) {
			stored = nil
		} else if err != nil {
			return nil, fmt.Errorf("store metadata: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	ok = true
	return stored, nil
}

// openForUpload opens path for writing, owned by a: an existing file (or
// a symlink's target) is chowned, then truncated; a new one is created,
// then chowned. created says the file did not exist before.
func openForUpload(path string, a account) (f *os.File, created bool, err error) {
	uid, gid := int(a.UID), int(a.GID)
	st, err := os.Stat(path)
	switch {
	case err == nil && st.IsDir():
		return nil, false, fmt.Errorf("path %q %w", path, errIsDir)
	case err == nil:
		err := os.Chown(path, uid, gid)
		if err == nil {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
			return f, false, err
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, false, err
		}
		// Removed meanwhile: made anew below.
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, err
	}
	f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	created = err == nil
	if errors.Is(err, fs.ErrExist) {
		// A dangling symlink (its target is made, as in E2B) or a file
		// made meanwhile.
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	}
	if err != nil {
		return nil, false, err
	}
	if err := f.Chown(uid, gid); err != nil {
		f.Close()
		if created {
			os.Remove(path)
		}
		return nil, false, err
	}
	return f, created, nil
}

// TrimToken removes the access token variable from a list of environment
// variables.
func TrimToken(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, TokenEnv+"=") {
			out = append(out, kv)
		}
	}
	return out
}
