package sandboxfusion

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"path"
)

// jupyterDriver runs the cells of a /run_jupyter call one after another
// in one namespace, as a notebook's kernel does: a cell sees what the
// cells before it defined, the value of a cell's last expression is its
// display ({"text/plain": repr}), an exception is its error ({ename,
// evalue, traceback}) and the next cell still runs. It writes the cells'
// results as JSON to the file named by its second argument.
const jupyterDriver = `import ast, contextlib, io, json, signal, sys, traceback
cfg = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__", "__builtins__": __builtins__}
class CellTimeout(Exception):
    pass
def alarm(signum, frame):
    raise CellTimeout("the cell ran past cell_timeout")
signal.signal(signal.SIGALRM, alarm)
cells = []
for i, src in enumerate(cfg["cells"]):
    r = {"stdout": "", "stderr": "", "display": [], "error": []}
    out, err = io.StringIO(), io.StringIO()
    name = "<cell %d>" % (i + 1)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if cfg["cell_timeout"] > 0:
                signal.setitimer(signal.ITIMER_REAL, cfg["cell_timeout"])
            try:
                tree = ast.parse(src, name)
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = ast.Expression(tree.body.pop().value)
                exec(compile(tree, name, "exec"), ns)
                if last is not None:
                    value = eval(compile(last, name, "eval"), ns)
                    if value is not None:
                        ns["_"] = value
                        r["display"].append({"text/plain": repr(value)})
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as e:
        r["error"].append({"ename": type(e).__name__, "evalue": str(e),
                           "traceback": traceback.format_exception(type(e), e, e.__traceback__)})
    r["stdout"], r["stderr"] = out.getvalue(), err.getvalue()
    cells.append(r)
with open(sys.argv[2], "w") as f:
    json.dump({"cells": cells}, f)
`

const (
	jupyterDriverPath = "/tmp/.sandboxfusion-jupyter.py"
	jupyterInputPath  = "/tmp/.sandboxfusion-cells.json"
	jupyterOutputPath = "/tmp/.sandboxfusion-cells-out.json"
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
	files := map[string][]byte{jupyterDriverPath: []byte(jupyterDriver), jupyterInputPath: input, path.Join(codeDir, ".keep"): nil}
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
