package sandboxfusion

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"time"

	"github.com/agentenv/agentenv/client"
)

const (
	// codeDir is the directory the code, its files and fetch_files'
	// relative paths are in (SandboxFusion's temporary directory).
	codeDir = "/tmp/code"
	// maxOutput is the most of each of stdout and stderr a command
	// returns; the rest is dropped.
	maxOutput = 8 << 20
	// maxFetch is the most bytes one fetched file may have.
	maxFetch = 32 << 20
	// maxTimeout bounds compile_timeout and run_timeout (and
	// total_timeout); maxCallTime is what a call may take in all.
	maxTimeout  = 5 * time.Minute
	maxCallTime = 2*maxTimeout + time.Minute
)

func (s *Service) serveRunCode(w http.ResponseWriter, r *http.Request) {
	var req RunCodeRequest
	if decode(w, r, &req) {
		writeJSON(w, http.StatusOK, s.RunCode(r.Context(), req))
	}
}

func (s *Service) serveRunJupyter(w http.ResponseWriter, r *http.Request) {
	var req RunJupyterRequest
	if decode(w, r, &req) {
		writeJSON(w, http.StatusOK, s.RunJupyter(r.Context(), req))
	}
}

func seconds(v *float64, def float64) (time.Duration, error) {
	f := def
	if v != nil {
		f = *v
	}
	d := time.Duration(f * float64(time.Second))
	if f <= 0 || d > maxTimeout {
		return 0, fmt.Errorf("timeout %gs: give a number of seconds above 0 and at most %d", f, int(maxTimeout.Seconds()))
	}
	return d, nil
}

// RunCode runs one /run_code call in a sandbox of its own.
func (s *Service) RunCode(ctx context.Context, req RunCodeRequest) RunCodeResponse {
	fail := func(err error) RunCodeResponse {
		return RunCodeResponse{Status: SandboxError, Message: err.Error(), Files: map[string]string{}}
	}
	lang, err := lookupLanguage(req.Language)
	if err != nil {
		return fail(err)
	}
	compileT, err := seconds(req.CompileTimeout, 10)
	if err != nil {
		return fail(fmt.Errorf("compile_timeout: %w", err))
	}
	runT, err := seconds(req.RunTimeout, 10)
	if err != nil {
		return fail(fmt.Errorf("run_timeout: %w", err))
	}
	mem := -1
	if req.MemoryLimitMB != nil {
		mem = *req.MemoryLimitMB
	}
	files := map[string][]byte{path.Join(codeDir, lang.file): []byte(req.Code)}
	for name, content := range req.Files {
		if content == nil {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(*content)
		if err != nil {
			return fail(fmt.Errorf("files[%q] is not base64: %w", name, err))
		}
		files[inDir(name)] = b
	}
	c, err := s.begin(ctx, mem, compileT+runT)
	if err != nil {
		return fail(err)
	}
	defer c.end()
	if err := c.write(ctx, files); err != nil {
		return fail(err)
	}
	resp := RunCodeResponse{Files: map[string]string{}}
	if lang.compile != nil {
		resp.CompileResult = c.command(ctx, lang.compile, nil, compileT)
	}
	if cr := resp.CompileResult; cr == nil || cr.Status == Finished && *cr.ReturnCode == 0 {
		var stdin []byte
		if req.Stdin != nil {
			stdin = []byte(*req.Stdin)
		}
		resp.RunResult = c.command(ctx, runArgv(lang, mem), stdin, runT)
	}
	resp.Files, err = c.fetch(ctx, req.FetchFiles)
	if err != nil {
		return fail(err)
	}
	resp.Status, resp.Message = outcome(resp.CompileResult, resp.RunResult)
	return resp
}

// inDir places a client's file name: relative names are in codeDir.
func inDir(name string) string {
	if path.IsAbs(name) {
		return path.Clean(name)
	}
	return path.Join(codeDir, name)
}

// runArgv is the run command of lang under memory limit mem (MiB; -1 none).
func runArgv(lang language, mem int) []string {
	switch {
	case mem <= 0:
		return lang.run
	case lang.limitAS:
		return append([]string{"/usr/bin/prlimit", "--as=" + strconv.FormatInt(int64(mem)<<20, 10), "--"}, lang.run...)
	case lang.heapFlag != "":
		return append([]string{lang.run[0], lang.heapFlag + strconv.Itoa(mem)}, lang.run[1:]...)
	}
	return lang.run
}

// outcome is SandboxFusion's status of a call from its commands: an Error
// is SandboxError with that command's stderr; a time limit or a non-zero
// exit is Failed.
func outcome(cmds ...*CommandResult) (Status, string) {
	failed := false
	for _, c := range cmds {
		if c == nil {
			continue
		}
		switch {
		case c.Status == CommandError:
			return SandboxError, deref(c.Stderr)
		case c.Status == TimeLimitExceeded, c.ReturnCode != nil && *c.ReturnCode != 0:
			failed = true
		}
	}
	if failed {
		return Failed, ""
	}
	return Success, ""
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// call is one call's sandbox.
type call struct {
	s  *Service
	sb client.Sandbox
}

// begin waits for a slot, then takes a pooled sandbox or creates one
// that holds mem MiB (-1: the pool's size) and lives past work.
func (s *Service) begin(ctx context.Context, mem int, work time.Duration) (*call, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	memMB := s.cfg.MemoryMB
	if mem > 0 && mem+memoryHeadroomMB > memMB {
		memMB = mem + memoryHeadroomMB
	}
	sb, ok := s.pool.take(memMB)
	if !ok {
		var err error
		if sb, err = s.create(ctx, memMB, work+2*time.Minute); err != nil {
			<-s.slots
			return nil, fmt.Errorf("create a sandbox for the call: %w", err)
		}
	}
	return &call{s: s, sb: sb}, nil
}

// end kills the call's sandbox and frees its slot.
func (c *call) end() {
	<-c.s.slots
	go c.s.kill(c.sb.SandboxID)
}

func (c *call) write(ctx context.Context, files map[string][]byte) error {
	f := c.s.envd.Files(c.sb, "")
	for p, b := range files {
		if err := f.Write(ctx, p, bytes.NewReader(b)); err != nil {
			return fmt.Errorf("write %s into the sandbox: %w", p, err)
		}
	}
	return nil
}

// fetch reads the named files that exist (relative to codeDir), base64.
func (c *call) fetch(ctx context.Context, names []string) (map[string]string, error) {
	out := map[string]string{}
	f := c.s.envd.Files(c.sb, "")
	for _, name := range names {
		r, err := f.Open(ctx, inDir(name))
		if err != nil {
			continue // SandboxFusion leaves out what is not there
		}
		b, err := io.ReadAll(io.LimitReader(r, maxFetch+1))
		r.Close()
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w", name, err)
		}
		if len(b) > maxFetch {
			return nil, fmt.Errorf("fetch_files: %s has more than the %d bytes one file may have", name, maxFetch)
		}
		out[name] = base64.StdEncoding.EncodeToString(b)
	}
	return out, nil
}

func errorResult(err error) *CommandResult {
	msg, empty := err.Error(), ""
	return &CommandResult{Status: CommandError, Stdout: &empty, Stderr: &msg}
}
