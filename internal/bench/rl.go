package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/template"
)

// The rl group measures the doors RL training code calls: E2B's code
// interpreter (runCode) and SandboxFusion's run_code, the latter beside the
// same Python run bare on the host and in a sandbox of its own per call.
const (
	codeInterpTemplate = "code-interpreter-v1"
	codeInterpPort     = 49999
	// runnerTemplate is the SandboxFusion service's default runner
	// template, which the server builds in the background when missing.
	runnerTemplate = "sandboxfusion"
	// rlCode is the call's program, as a verl code reward would send it;
	// rlWant its output.
	rlCode = "print(sum(i*i for i in range(1000)))"
	rlWant = "332833500\n"
	// rlReadyMax bounds the wait for the runner template's build.
	rlReadyMax = 15 * time.Minute
)

// rlLevels are the numbers of calls in flight the SandboxFusion rows run at.
var rlLevels = []int{1, 16}

// The ways a SandboxFusion call's work is done, in table order.
const (
	WaySandboxFusion = "sandboxfusion"
	WaySandboxPerRun = "sandbox_per_call"
	WayHost          = "host"
)

var rlWays = []struct{ key, label string }{
	{WaySandboxFusion, "agentenv SandboxFusion POST /run_code"},
	{WaySandboxPerRun, "agentenv create→exec python3 -c→kill, runner template"},
	{WayHost, "python3 -c on the host, no sandbox (floor)"},
}

// RLReport is the outcome of the rl group.
type RLReport struct {
	// RunCode is the latency of runCode("1 + 1"); RunCodeCPU its CPU per
	// call (empty when the server's CPU is not counted).
	RunCode    Stats   `json:"run_code"`
	RunCodeCPU CPUCost `json:"run_code_cpu"`
	// Calls holds, per way, one CallRate per level of rlLevels.
	Calls map[string][]CallRate `json:"calls,omitempty"`
	// CodeInterpreterBuildSeconds is how long code-interpreter-v1 took to
	// build (0: it existed); RunnerWaitSeconds how long the bench waited
	// for the SandboxFusion service's first successful call.
	CodeInterpreterBuildSeconds float64 `json:"code_interpreter_build_seconds"`
	RunnerWaitSeconds           float64 `json:"runner_wait_seconds"`
}

// CallRate is one way at one level: batches of calls, InFlight at a time.
type CallRate struct {
	InFlight int `json:"in_flight"`
	// CPU is per call; WallMs is wall time per call, so calls per second
	// is its inverse. CPUCounted is false when the way's CPU could not be
	// counted (a server the bench did not start).
	CPU        CPUCost `json:"cpu"`
	CPUCounted bool    `json:"cpu_counted"`
}

// PerSecond is calls per second over the median batch.
func (c CallRate) PerSecond() float64 {
	if c.CPU.WallMs <= 0 {
		return 0
	}
	return 1000 / c.CPU.WallMs
}

// rlCall does one call; cpu is its CPU time when the way counts it per call
// (a host process), else 0.
type rlCall func(ctx context.Context) (cpu time.Duration, err error)

// inFlight runs n calls, level at a time, and returns the CPU they
// reported. The first failure ends the batch.
func inFlight(ctx context.Context, level, n int, call rlCall) (time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		next  int
		total time.Duration
		errs  []error
		wg    sync.WaitGroup
	)
	for range min(level, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= n || len(errs) > 0 {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				cpu, err := call(ctx)
				mu.Lock()
				total += cpu
				if err != nil {
					errs = append(errs, err)
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return total, errs[0]
	}
	return total, nil
}

// rl measures runCode and the SandboxFusion rows.
func (r *runner) rl(ctx context.Context) error {
	r.rep.RL = &RLReport{Calls: map[string][]CallRate{}}
	r.rep.CPURounds = r.cfg.CPURounds
	if err := r.runCode(ctx); err != nil {
		return fmt.Errorf("runCode: %w", err)
	}
	if r.cfg.SandboxFusionURL == "" {
		r.rep.Notes = append(r.rep.Notes, "rl: SandboxFusion rows skipped: give --sandboxfusion-url, or --serve (the bench then starts its server with --sandboxfusion-listen)")
		return nil
	}
	return r.sandboxFusion(ctx)
}

// meter is a cpuMeter of the agentenv server's cgroup, calibrated, or nil
// when its CPU is not counted.
func (r *runner) meter(ctx context.Context) (*cpuMeter, error) {
	g := r.groups.get(TargetAgentenv)
	if g == nil {
		return nil, nil
	}
	m := newCPUMeter(g)
	return m, m.calibrate(ctx)
}

// runCode times runCode("1 + 1") on one code-interpreter-v1 sandbox,
// through the proxy to its port 49999, as E2B's SDKs call it.
func (r *runner) runCode(ctx context.Context) (err error) {
	c := r.cfg.Client
	if r.rep.RL.CodeInterpreterBuildSeconds, err = r.ensureCodeInterpreter(ctx); err != nil {
		return err
	}
	t := r.ts.agentenv
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: codeInterpTemplate, Timeout: new(int64(600)), Metadata: map[string]string{benchLabel: t.run}})
	if err != nil {
		return fmt.Errorf("create a %s sandbox: %w", codeInterpTemplate, err)
	}
	t.remember(sb)
	defer func() {
		if kerr := killAll(ctx, t, []string{sb.SandboxID}); kerr != nil {
			err = errors.Join(err, fmt.Errorf("kill %s: %w", sb.SandboxID, kerr))
		}
	}()
	hc, base := c.Port(sb, codeInterpPort)
	call := func(ctx context.Context) (time.Duration, error) { return 0, execute(ctx, hc, base, "1 + 1", "2") }
	for range max(r.cfg.Warmup, 1) { // the first cell also starts the kernel's session
		if _, err := call(ctx); err != nil {
			return err
		}
	}
	n := r.cfg.Iterations
	var times []time.Duration
	timed := func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		_, err := call(ctx)
		times = append(times, time.Since(start))
		return 0, err
	}
	var samples []cpuSample
	for round := range r.cfg.CPURounds {
		r.progressf("rl: runCode(\"1 + 1\"), round %d of %d, %d calls", round+1, r.cfg.CPURounds, n)
		s, err := r.batch(ctx, 1, n, timed)
		if err != nil {
			return err
		}
		samples = append(samples, s)
	}
	r.rep.RL.RunCode = Summarize(times)
	if r.groups.get(TargetAgentenv) != nil {
		r.rep.RL.RunCodeCPU = summarizeCPU(samples)
	}
	return nil
}

// batch runs n calls level at a time between two quiet points of the
// server's cgroup, when it is counted.
func (r *runner) batch(ctx context.Context, level, n int, call rlCall) (cpuSample, error) {
	m, err := r.meter(ctx)
	if err != nil {
		return cpuSample{}, err
	}
	if m == nil {
		start := time.Now()
		_, err := inFlight(ctx, level, n, call)
		return cpuSample{wall: time.Since(start), ops: n}, err
	}
	cpu, wall, err := m.measure(ctx, func(ctx context.Context) error {
		_, err := inFlight(ctx, level, n, call)
		return err
	})
	return cpuSample{cpu: cpu, wall: wall, ops: n}, err
}

// ensureCodeInterpreter builds code-interpreter-v1 when the server lacks
// it, as `agentenv template build code-interpreter-v1 --code-interpreter`
// does, and returns how long that took.
func (r *runner) ensureCodeInterpreter(ctx context.Context) (float64, error) {
	if _, err := r.cfg.Client.GetTemplate(ctx, codeInterpTemplate); err == nil {
		return 0, nil
	}
	r.progressf("rl: building template %s (Debian bookworm with ipykernel, numpy, pandas, matplotlib: minutes)", codeInterpTemplate)
	start := time.Now()
	phase := ""
	_, err := r.cfg.Client.BuildTemplate(ctx, client.BuildRequest{Name: codeInterpTemplate, Debian: "bookworm",
		Packages: template.CodeInterpreterPackages, CodeInterpreter: true}, func(p client.BuildProgress) {
		if p.Phase != phase {
			phase = p.Phase
			r.progressf("rl: build %s: %s", codeInterpTemplate, phase)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("build %s: %w", codeInterpTemplate, err)
	}
	return time.Since(start).Seconds(), nil
}

// execute runs code through the code interpreter's POST /execute and
// checks that its main result's text is want.
func execute(ctx context.Context, hc *http.Client, base, code, want string) error {
	body, _ := json.Marshal(map[string]any{"code": code, "context_id": nil, "language": nil, "env_vars": nil})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/execute", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("POST /execute: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return checkExecution(resp.Body, want)
}

// checkExecution reads an /execute answer (one JSON object a line) to its
// end_of_execution and checks that the cell raised nothing and that its
// main result's text is want.
func checkExecution(r io.Reader, want string) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	got := ""
	for sc.Scan() {
		var line struct {
			Type   string `json:"type"`
			Text   string `json:"text"`
			Main   bool   `json:"is_main_result"`
			Name   string `json:"name"`
			Value  string `json:"value"`
			Output string `json:"output"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("a line of the /execute answer is not JSON: %w", err)
		}
		switch line.Type {
		case "result":
			if line.Main {
				got = line.Text
			}
		case "error":
			return fmt.Errorf("the cell raised %s: %s", line.Name, line.Value)
		case "end_of_execution":
			if got != want {
				return fmt.Errorf("the cell's result is %q, want %q", got, want)
			}
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the /execute answer ended before end_of_execution")
}

// sandboxFusion measures the three ways at each level, rounds of batches
// with the ways taking turns, so a slow phase of the host hits them alike.
func (r *runner) sandboxFusion(ctx context.Context) error {
	sf := sfClient{url: strings.TrimSuffix(r.cfg.SandboxFusionURL, "/"), hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}}
	r.progressf("rl: waiting for the SandboxFusion service's runner template %q (built once when missing: minutes)", runnerTemplate)
	start := time.Now()
	if err := sf.waitReady(ctx); err != nil {
		return err
	}
	r.rep.RL.RunnerWaitSeconds = time.Since(start).Seconds()
	r.rep.Notes = append(r.rep.Notes, "rl: the host's python3 is "+r.cfg.HostPython+" (--host-python)")
	t := r.ts.agentenv
	calls := map[string]rlCall{
		WaySandboxFusion: func(ctx context.Context) (time.Duration, error) { return 0, sf.runCode(ctx) },
		WaySandboxPerRun: func(ctx context.Context) (time.Duration, error) { return 0, sandboxPerCall(ctx, t) },
		WayHost:          func(ctx context.Context) (time.Duration, error) { return hostPython(ctx, r.cfg.HostPython) },
	}
	// Untimed: the first call of each way pays for cold caches.
	for _, w := range rlWays {
		if _, err := calls[w.key](ctx); err != nil {
			return fmt.Errorf("%s: warm-up: %w", w.key, err)
		}
	}
	samples := map[string][][]cpuSample{}
	for _, w := range rlWays {
		samples[w.key] = make([][]cpuSample, len(rlLevels))
	}
	for round := range r.cfg.CPURounds {
		for li, level := range rlLevels {
			n := max(2*r.cfg.CPUOps, 4*level)
			for _, w := range rlWays {
				r.progressf("rl: %s, %d calls %d in flight, round %d of %d", w.key, n, level, round+1, r.cfg.CPURounds)
				var s cpuSample
				var err error
				if w.key == WayHost {
					s, err = hostBatch(ctx, level, n, calls[w.key])
				} else {
					s, err = r.batch(ctx, level, n, calls[w.key])
				}
				if err != nil {
					return fmt.Errorf("%s at %d in flight: %w", w.key, level, err)
				}
				samples[w.key][li] = append(samples[w.key][li], s)
			}
		}
	}
	counted := r.groups.get(TargetAgentenv) != nil
	for _, w := range rlWays {
		for li, level := range rlLevels {
			r.rep.RL.Calls[w.key] = append(r.rep.RL.Calls[w.key], CallRate{InFlight: level, CPU: summarizeCPU(samples[w.key][li]), CPUCounted: counted || w.key == WayHost})
		}
	}
	return nil
}

// hostBatch runs n host processes level at a time; their CPU is what the
// kernel accounted to each (rusage), the bench's own CPU left out.
func hostBatch(ctx context.Context, level, n int, call rlCall) (cpuSample, error) {
	start := time.Now()
	cpu, err := inFlight(ctx, level, n, call)
	return cpuSample{cpu: cpu, wall: time.Since(start), ops: n}, err
}

// hostPython runs the call's program in the host's python3 at path.
func hostPython(ctx context.Context, path string) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, path, "-c", rlCode)
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("python3 on the host: %w", err)
	}
	if string(out) != rlWant {
		return 0, fmt.Errorf("python3 on the host printed %q, want %q", out, rlWant)
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}

// sandboxPerCall creates a sandbox of the runner template, runs the
// program in it and kills it.
func sandboxPerCall(ctx context.Context, t *agentenvTarget) (err error) {
	sb, err := t.c.CreateSandbox(ctx, client.CreateRequest{TemplateID: runnerTemplate, Timeout: new(int64(300)), Metadata: map[string]string{benchLabel: t.run}})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	t.remember(sb)
	defer func() {
		if kerr := t.kill(context.WithoutCancel(ctx), sb.SandboxID); kerr != nil {
			err = errors.Join(err, fmt.Errorf("kill: %w", kerr))
		}
	}()
	res, err := t.c.Exec(ctx, sb, "python3", []string{"-c", rlCode}, nil, nil)
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if res.ExitCode != 0 || string(res.Stdout) != rlWant {
		return fmt.Errorf("python3 exited with %d and printed %q, want 0 and %q (stderr %q)", res.ExitCode, res.Stdout, rlWant, res.Stderr)
	}
	return nil
}

// sfClient calls a SandboxFusion service.
type sfClient struct {
	url string
	hc  *http.Client
}

// verlRequest is the body verl's code reward sends to sandbox_fusion_url,
// key for key in its order.
type verlRequest struct {
	CompileTimeout int      `json:"compile_timeout"`
	RunTimeout     int      `json:"run_timeout"`
	Code           string   `json:"code"`
	Stdin          *string  `json:"stdin"`
	MemoryLimitMB  int      `json:"memory_limit_MB"`
	Language       string   `json:"language"`
	Files          struct{} `json:"files"`
	FetchFiles     []string `json:"fetch_files"`
}

// sfAnswer is the part of /run_code's answer the bench checks.
type sfAnswer struct {
	Status    string `json:"status"`
	Message   string `json:"message"`
	RunResult *struct {
		Status string `json:"status"`
		Stdout string `json:"stdout"`
		Stderr string `json:"stderr"`
	} `json:"run_result"`
}

// check says what is wrong with an answer, or nil when the program ran
// and printed rlWant.
func (a sfAnswer) check() error {
	if a.Status != "Success" || a.RunResult == nil || a.RunResult.Stdout != rlWant {
		b, _ := json.Marshal(a)
		return fmt.Errorf("run_code answered %s, want status Success and stdout %q", b, rlWant)
	}
	return nil
}

func (c sfClient) call(ctx context.Context) (sfAnswer, error) {
	body, _ := json.Marshal(verlRequest{CompileTimeout: 30, RunTimeout: 30, Code: rlCode, MemoryLimitMB: 1024, Language: "python", FetchFiles: []string{}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/run_code", bytes.NewReader(body))
	if err != nil {
		return sfAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return sfAnswer{}, err
	}
	defer resp.Body.Close()
	var a sfAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return sfAnswer{}, fmt.Errorf("POST /run_code: HTTP %d, answer not JSON: %w", resp.StatusCode, err)
	}
	return a, nil
}

func (c sfClient) runCode(ctx context.Context) error {
	a, err := c.call(ctx)
	if err != nil {
		return err
	}
	return a.check()
}

// waitReady polls until a call succeeds: the service answers SandboxError
// while its runner template is being built.
func (c sfClient) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(rlReadyMax)
	for {
		err := c.runCode(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the SandboxFusion service at %s ran no call within %s: %w", c.url, rlReadyMax, err)
		}
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return err
		}
	}
}
