package server_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/template"
)

// codeInterpreterName is the template E2B's code interpreter SDKs create
// sandboxes from unless told otherwise.
const codeInterpreterName = "code-interpreter-v1"

var (
	codeInterpOnce sync.Once
	codeInterpErr  error
)

// codeInterpreterTemplate builds code-interpreter-v1 on the shared server
// once per test run, as `agentenv template build code-interpreter-v1
// --code-interpreter` does (debootstrap of Python with ipykernel, numpy,
// pandas and matplotlib: minutes, so every test that needs it shares it).
func codeInterpreterTemplate(t *testing.T, e *env) {
	t.Helper()
	codeInterpOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		start := time.Now()
		phase := ""
		_, codeInterpErr = e.client.BuildTemplate(ctx, client.BuildRequest{Name: codeInterpreterName, Debian: "bookworm",
			Packages: template.CodeInterpreterPackages, CodeInterpreter: true}, func(p client.BuildProgress) {
			if p.Phase != phase {
				phase = p.Phase
				t.Logf("build %s: %s at %s", codeInterpreterName, phase, time.Since(start).Round(time.Second))
			}
		})
		t.Logf("template %s built in %s", codeInterpreterName, time.Since(start).Round(time.Second))
	})
	if codeInterpErr != nil {
		t.Fatalf("build %s: %v", codeInterpreterName, codeInterpErr)
	}
}

// TestE2BCodeInterpreter runs E2B's code interpreter JS SDK, unchanged,
// against code-interpreter-v1: runCode's state, output, errors, charts,
// DataFrames, the sandbox's envs, contexts, a timed-out cell, and a fork
// child, a snapshot's sandbox and a resumed sandbox that continue the
// kernel.
func TestE2BCodeInterpreter(t *testing.T) {
	e := sharedServer(t)
	codeInterpreterTemplate(t, e)
	runSDKTest(t, e, "codeinterp.test.mjs")
}

// TestPythonCodeInterpreter runs the Python SDK's code interpreter names
// (agentenv.code_interpreter: run_code, contexts, Execution...) and the RL
// RunCode action against code-interpreter-v1.
func TestPythonCodeInterpreter(t *testing.T) {
	e := sharedServer(t)
	codeInterpreterTemplate(t, e)
	sdk, err := filepath.Abs("../../sdk/python")
	if err != nil {
		t.Fatal(err)
	}
	runPython(t, e, sdk, []string{"AGENTENV_CODE_INTERPRETER=1"}, "-m", "unittest", "-v", "tests.test_code_interpreter")
}
