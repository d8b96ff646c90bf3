package sandboxfusion

import (
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"path"
)

// jupyterDriver runs the cells of a /run_jupyter call in one Python
// process (see the file); jupyterBackend is the matplotlib backend it sets,
// which turns plt.show() into displays with PNGs.
//
//go:embed jupyter_driver.py
var jupyterDriver []byte

//go:embed sandboxfusion_inline.py
var jupyterBackend []byte

const (
	jupyterDriverPath  = "/tmp/.sandboxfusion/jupyter_driver.py"
	jupyterBackendPath = "/tmp/.sandboxfusion/sandboxfusion_inline.py"
	jupyterInputPath   = "/tmp/.sandboxfusion/cells.json"
	jupyterOutputPath  = "/tmp/.sandboxfusion/cells-out.json"
)

// RunJupyter runs one /run_jupyter call in a sandbox of its own.
func (s *Service) RunJupyter(ctx context.Context, req RunJupyterRequest) RunJupyterResponse {
	fail := func(err error) RunJupyterResponse {
		return RunJupyterResponse{Status: SandboxError, Message: err.Error(), Cells: []CellResult{}, Files: map[string]string{}}
	}
	if req.Kernel != "" && req.Kernel != "python3" {
		return fail(fmt.Errorf("kernel %q is not supported: the only kernel is python3", req.Kernel))
	}
	total, err := seconds(req.TotalTimeout, 45)
	if err != nil {
		return fail(fmt.Errorf("total_timeout: %w", err))
	}
	cellT := 0.0
	if req.CellTimeout != nil {
		cellT = *req.CellTimeout
	}
	mem := -1
	if req.MemoryLimitMB != nil {
		mem = *req.MemoryLimitMB
	}
	input, err := json.Marshal(map[string]any{"cells": req.Cells, "cell_timeout": cellT})
	if err != nil {
		return fail(err)
	}
	files := map[string][]byte{jupyterDriverPath: jupyterDriver, jupyterBackendPath: jupyterBackend, jupyterInputPath: input, path.Join(codeDir, ".keep"): nil}
	for name, content := range req.Files {
		b, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return fail(fmt.Errorf("files[%q] is not base64: %w", name, err))
		}
		files[inDir(name)] = b
	}
	c, err := s.begin(ctx, mem, total)
	if err != nil {
		return fail(err)
	}
	defer c.end()
	if err := c.write(ctx, files); err != nil {
		return fail(err)
	}
	argv := runArgv(language{run: []string{"/usr/bin/python3", jupyterDriverPath, jupyterInputPath, jupyterOutputPath}, limitAS: true}, mem)
	resp := RunJupyterResponse{Driver: c.command(ctx, argv, nil, total), Cells: []CellResult{}, Files: map[string]string{}}
	if d := resp.Driver; d.Status == CommandError {
		resp.Status, resp.Message = SandboxError, deref(d.Stderr)
		return resp
	} else if d.Status != Finished || *d.ReturnCode != 0 {
		resp.Status = Failed
		return resp
	}
	var out struct {
		Cells []CellResult `json:"cells"`
	}
	if err := c.readJSON(ctx, jupyterOutputPath, &out); err != nil {
		return fail(fmt.Errorf("read the cells' results: %w", err))
	}
	if resp.Files, err = c.fetch(ctx, req.FetchFiles); err != nil {
		return fail(err)
	}
	resp.Status, resp.Cells = Success, out.Cells
	for i := range resp.Cells {
		if resp.Cells[i].Display == nil {
			resp.Cells[i].Display = []map[string]any{}
		}
		if resp.Cells[i].Error == nil {
			resp.Cells[i].Error = []map[string]any{}
		}
	}
	return resp
}

func (c *call) readJSON(ctx context.Context, p string, v any) error {
	r, err := c.s.envd.Files(c.sb, "").Open(ctx, p)
	if err != nil {
		return err
	}
	defer r.Close()
	return json.NewDecoder(io.LimitReader(r, 4*maxOutput)).Decode(v)
}
