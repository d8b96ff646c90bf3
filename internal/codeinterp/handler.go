package codeinterp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

type executeBody struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// execute runs one cell and streams its output, one JSON object a line,
// ending with end_of_execution.
func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req executeBody
	if err := decodeBody(r, &req); err != nil {
		httpError(w, err)
		return
	}
	if req.ContextID != "" && req.Language != "" {
		httpError(w, fmt.Errorf("%w: give context_id or language, not both", errInvalid))
		return
	}
	var c *codeContext
	var err error
	if req.ContextID != "" {
		c, err = s.lookup(req.ContextID)
	} else {
		c, err = s.defaultContext(r.Context(), normalizeLanguage(req.Language))
	}
	if err != nil {
		httpError(w, err)
		return
	}
	ctx := r.Context()
	if err := c.k.acquire(ctx); err != nil {
		return
	}
	defer c.k.release()

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	emit := func(line map[string]any) error {
		if err := enc.Encode(line); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	if flusher != nil {
		flusher.Flush()
	}
	quiet := func(map[string]any) error { return nil }
	if !c.envLoaded {
		// The kernel may have started before the sandbox existed (in the
		// template's ready snapshot): it gets the sandbox's variables now.
		if vars := s.sandboxEnv(ctx, r.Header.Get("X-Access-Token")); vars != nil {
			if err := c.k.run(ctx, setEnvCode(vars, false), true, quiet); err != nil {
				emit(errorLine("ContextError", err.Error(), nil))
			}
		}
		c.envLoaded = true
	}
	if len(req.EnvVars) > 0 {
		if err := c.k.run(ctx, setEnvCode(req.EnvVars, true), true, quiet); err != nil {
			emit(errorLine("ContextError", err.Error(), nil))
		}
		defer c.k.run(context.WithoutCancel(ctx), restoreEnvCode, true, quiet)
	}
	if err := c.k.run(ctx, req.Code, false, emit); err != nil {
		emit(errorLine("ContextError", err.Error(), nil))
	}
	emit(map[string]any{"type": lineEndOfCells})
}

// sandboxEnv asks envd for the sandbox's environment variables.
func (s *Server) sandboxEnv(ctx context.Context, token string) map[string]string {
	if s.cfg.EnvdURL == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", s.cfg.EnvdURL+"/envs", nil)
	if err != nil {
		return nil
	}
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.cfg.Log.Warn("ask envd for the sandbox's variables", "err", err)
		return nil
	}
	defer resp.Body.Close()
	var vars map[string]string
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&vars) != nil {
		s.cfg.Log.Warn("ask envd for the sandbox's variables", "status", resp.Status)
		return nil
	}
	return vars
}

// setEnvCode is Python that sets vars in the kernel's os.environ; with
// save, the values they replace are kept for restoreEnvCode. The values
// travel as JSON inside a string literal (JSON's escapes are Python's).
func setEnvCode(vars map[string]string, save bool) string {
	b, _ := json.Marshal(vars)
	lit, _ := json.Marshal(string(b))
	code := "import os as _ci_os, json as _ci_json, sys as _ci_sys\n_ci_vars = _ci_json.loads(" + string(lit) + ")\n"
	if save {
		code += "_ci_sys._codeinterp_saved_env = {k: _ci_os.environ.get(k) for k in _ci_vars}\n"
	}
	return code + "_ci_os.environ.update(_ci_vars)\ndel _ci_os, _ci_json, _ci_sys, _ci_vars\n"
}

// restoreEnvCode puts back what setEnvCode(…, true) replaced.
const restoreEnvCode = `import os as _ci_os, sys as _ci_sys
for _ci_k, _ci_v in _ci_sys.__dict__.pop('_codeinterp_saved_env', {}).items():
    if _ci_v is None:
        _ci_os.environ.pop(_ci_k, None)
    else:
        _ci_os.environ[_ci_k] = _ci_v
del _ci_os, _ci_sys
try:
    del _ci_k, _ci_v
except NameError:
    pass
`
