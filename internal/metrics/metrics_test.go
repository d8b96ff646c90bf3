package metrics_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/metrics"
)

// scrape serves reg's /metrics and returns each sample line as series →
// value, e.g. `agentenv_sandboxes{role="node",state="running"}` → "3".
func scrape(t *testing.T, reg *metrics.Registry) map[string]string {
	t.Helper()
	rec := httptest.NewRecorder()
	reg.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: got status %d, want 200: %s", rec.Code, rec.Body)
	}
	samples := map[string]string{}
	for line := range strings.Lines(rec.Body.String()) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		samples[line[:i]] = line[i+1:]
	}
	return samples
}

// checkSamples reports each want series whose value differs; a value of ""
// means the series must be absent.
func checkSamples(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	for series, w := range want {
		g, ok := got[series]
		switch {
		case w == "" && ok:
			t.Errorf("%s: got %s, want absent", series, g)
		case w != "" && !ok:
			t.Errorf("%s: absent, want %s", series, w)
		case w != "" && g != w:
			t.Errorf("%s: got %s, want %s", series, g, w)
		}
	}
}

var (
	errNotFound = errors.New("not found")
	errBusy     = errors.New("busy")
)

func cause(err error) string {
	switch {
	case errors.Is(err, errNotFound):
		return "not_found"
	case errors.Is(err, errBusy):
		return "unavailable"
	}
	return ""
}

func TestObserveBootStep(t *testing.T) {
	reg := metrics.New("serve")
	reg.ObserveBootStep("create", "envd", 30*time.Millisecond, 2*time.Millisecond)
	reg.ObserveBootStep("create", "envd", 10*time.Millisecond, -1)
	reg.ObserveBootStep("create", "slot", 200*time.Microsecond, -1)
	var nilReg *metrics.Registry
	nilReg.ObserveBootStep("create", "envd", time.Second, time.Second) // a no-op
	checkSamples(t, scrape(t, reg), map[string]string{
		`agentenv_boot_step_seconds_count{clock="wall",kind="create",role="serve",step="envd"}`:               "2",
		`agentenv_boot_step_seconds_count{clock="cpu",kind="create",role="serve",step="envd"}`:                "1",
		`agentenv_boot_step_seconds_bucket{clock="cpu",kind="create",role="serve",step="envd",le="0.0025"}`:   "1",
		`agentenv_boot_step_seconds_bucket{clock="wall",kind="create",role="serve",step="slot",le="0.00025"}`: "1",
		`agentenv_boot_step_seconds_count{clock="cpu",kind="create",role="serve",step="slot"}`:                "",
	})
}

func TestObserveOp(t *testing.T) {
	type obs struct {
		op  string
		d   time.Duration
		err error
	}
	tests := []struct {
		name  string
		cause func(error) string
		obs   []obs
		want  map[string]string
	}{
		{
			name:  "latencies and errors by cause",
			cause: cause,
			obs: []obs{
				{metrics.OpCreate, 4 * time.Millisecond, nil},
				{metrics.OpCreate, 2 * time.Second, fmt.Errorf("template x: %w", errNotFound)},
				{metrics.OpCreate, time.Second, errBusy},
				{metrics.OpExec, time.Millisecond, nil},
				{metrics.OpFork, 40 * time.Second, errors.New("boom")},
			},
			want: map[string]string{
				`agentenv_operation_duration_seconds_count{op="create",role="node"}`:             "3",
				`agentenv_operation_duration_seconds_bucket{op="create",role="node",le="0.005"}`: "1",
				`agentenv_operation_duration_seconds_bucket{op="create",role="node",le="1"}`:     "2",
				`agentenv_operation_duration_seconds_bucket{op="create",role="node",le="+Inf"}`:  "3",
				`agentenv_operation_duration_seconds_sum{op="create",role="node"}`:               "3.004",
				`agentenv_operation_duration_seconds_count{op="exec",role="node"}`:               "1",
				`agentenv_operation_duration_seconds_bucket{op="fork",role="node",le="30"}`:      "0",
				`agentenv_operation_duration_seconds_bucket{op="fork",role="node",le="+Inf"}`:    "1",
				`agentenv_operation_errors_total{cause="not_found",op="create",role="node"}`:     "1",
				`agentenv_operation_errors_total{cause="unavailable",op="create",role="node"}`:   "1",
				`agentenv_operation_errors_total{cause="error",op="fork",role="node"}`:           "1",
				`agentenv_operation_errors_total{cause="error",op="exec",role="node"}`:           "",
			},
		},
		{
			name: "default cause",
			obs: []obs{
				{metrics.OpSnapshot, time.Second, errNotFound},
				{metrics.OpSnapshot, time.Second, errBusy},
			},
			want: map[string]string{
				`agentenv_operation_errors_total{cause="error",op="snapshot",role="node"}`: "2",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := metrics.New("node")
			reg.SetCause(tt.cause)
			for _, o := range tt.obs {
				reg.ObserveOp(o.op, o.d, o.err)
			}
			checkSamples(t, scrape(t, reg), tt.want)
		})
	}
}

func TestProcessCollectors(t *testing.T) {
	got := scrape(t, metrics.New("api"))
	for _, series := range []string{`go_goroutines{role="api"}`, `process_open_fds{role="api"}`} {
		if _, ok := got[series]; !ok {
			t.Errorf("%s: absent, want present", series)
		}
	}
}

// TestObserveOpConcurrent runs ObserveOp from 16 goroutines (under -race)
// and checks no observation is lost.
func TestObserveOpConcurrent(t *testing.T) {
	const workers, each = 16, 500
	reg := metrics.New("serve")
	reg.SetCause(cause)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				var err error
				if i%5 == 0 {
					err = errBusy
				}
				reg.ObserveOp(metrics.OpExec, time.Duration(w+i)*time.Millisecond, err)
				if i == each/2 && w == 0 {
					reg.SetCause(nil) // replaced while others observe
					reg.SetCause(cause)
				}
			}
		})
	}
	// Scrape while they run (not with scrape: t.Fatal belongs to the test goroutine).
	wg.Go(func() {
		rec := httptest.NewRecorder()
		reg.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if rec.Code != http.StatusOK {
			t.Errorf("GET /metrics during observations: got status %d, want 200", rec.Code)
		}
	})
	wg.Wait()

	got := scrape(t, reg)
	if g, w := got[`agentenv_operation_duration_seconds_count{op="exec",role="serve"}`], fmt.Sprint(workers*each); g != w {
		t.Errorf("exec count: got %s, want %s", g, w)
	}
	var errs int
	for _, c := range []string{"unavailable", "error"} {
		var n int
		fmt.Sscan(got[`agentenv_operation_errors_total{cause="`+c+`",op="exec",role="serve"}`], &n)
		errs += n
	}
	if w := workers * each / 5; errs != w {
		t.Errorf("exec errors: got %d, want %d", errs, w)
	}
}

func TestGauges(t *testing.T) {
	tests := []struct {
		name string
		set  func(*metrics.Registry)
		want map[string]string
	}{
		{
			name: "none set",
			set:  func(*metrics.Registry) {},
			want: map[string]string{
				`agentenv_node_cpus{role="node"}`:                 "",
				`agentenv_fleet_nodes{role="node",state="alive"}`: "",
				`agentenv_sandboxes{role="node",state="running"}`: "",
				`agentenv_snapshot_store_bytes{role="node"}`:      "",
			},
		},
		{
			name: "sandbox states",
			set: func(r *metrics.Registry) {
				r.SetSandboxes(func() []metrics.SandboxCount {
					return []metrics.SandboxCount{{"running", "base", 2}, {"running", "base", 1}, {"paused", "base", 1}, {"running", "py", 0}}
				})
			},
			want: map[string]string{
				`agentenv_sandboxes{role="node",state="running",template="base"}`: "3",
				`agentenv_sandboxes{role="node",state="paused",template="base"}`:  "1",
				`agentenv_sandboxes{role="node",state="running",template="py"}`:   "0",
			},
		},
		{
			name: "pools",
			set: func(r *metrics.Registry) {
				r.SetPools(func() metrics.Pools {
					return metrics.Pools{Warm: map[string]int{"base": 2}, Hot: map[string]int{"base": 1, "py": 0}, SnapshotBytes: 4096, ReapedByTimeout: 5}
				})
			},
			want: map[string]string{
				`agentenv_pool_sandboxes{pool="warm",role="node",template="base"}`: "2",
				`agentenv_pool_sandboxes{pool="hot",role="node",template="base"}`:  "1",
				`agentenv_pool_sandboxes{pool="hot",role="node",template="py"}`:    "0",
				`agentenv_snapshot_store_bytes{role="node"}`:                       "4096",
				`agentenv_sandboxes_reaped_total{role="node"}`:                     "5",
			},
		},
		{
			name: "capacity",
			set: func(r *metrics.Registry) {
				r.SetCapacity(func() metrics.Capacity {
					return metrics.Capacity{CPUs: 8, MemoryMB: 2048, FreeMemoryMB: 1024, MaxSandboxes: 100, Sandboxes: 7, Templates: 2, Snapshots: 5}
				})
			},
			want: map[string]string{
				`agentenv_node_cpus{role="node"}`:              "8",
				`agentenv_node_memory_bytes{role="node"}`:      "2.147483648e+09",
				`agentenv_node_free_memory_bytes{role="node"}`: "1.073741824e+09",
				`agentenv_node_max_sandboxes{role="node"}`:     "100",
				`agentenv_node_sandboxes{role="node"}`:         "7",
				`agentenv_node_templates{role="node"}`:         "2",
				`agentenv_node_snapshots{role="node"}`:         "5",
			},
		},
		{
			name: "fleet nodes",
			set: func(r *metrics.Registry) {
				r.SetNodes(func() []metrics.NodeInfo {
					return []metrics.NodeInfo{
						{Name: "a", Alive: true, Sandboxes: 4, FreeMemoryMB: 1},
						{Name: "b", Alive: true, Cordoned: true, Sandboxes: 2},
						{Name: "c", Alive: false, Cordoned: true},
						{Name: "d", Alive: true},
						{Name: "a", Alive: true, Sandboxes: 99}, // listed twice: first kept
					}
				})
			},
			want: map[string]string{
				`agentenv_fleet_nodes{role="node",state="alive"}`:             "3",
				`agentenv_fleet_nodes{role="node",state="cordoned"}`:          "1",
				`agentenv_fleet_nodes{role="node",state="lost"}`:              "1",
				`agentenv_fleet_node_sandboxes{node="a",role="node"}`:         "4",
				`agentenv_fleet_node_sandboxes{node="b",role="node"}`:         "2",
				`agentenv_fleet_node_sandboxes{node="c",role="node"}`:         "0",
				`agentenv_fleet_node_free_memory_bytes{node="a",role="node"}`: "1.048576e+06",
			},
		},
		{
			name: "replaced and cleared",
			set: func(r *metrics.Registry) {
				r.SetSandboxes(func() []metrics.SandboxCount { return []metrics.SandboxCount{{"running", "b", 1}} })
				r.SetSandboxes(func() []metrics.SandboxCount { return []metrics.SandboxCount{{"running", "b", 2}} })
				r.SetCapacity(func() metrics.Capacity { return metrics.Capacity{CPUs: 1} })
				r.SetCapacity(nil)
			},
			want: map[string]string{
				`agentenv_sandboxes{role="node",state="running",template="b"}`: "2",
				`agentenv_node_cpus{role="node"}`:                              "",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := metrics.New("node")
			tt.set(reg)
			checkSamples(t, scrape(t, reg), tt.want)
		})
	}
}

func TestGaugesReadAtScrape(t *testing.T) {
	reg := metrics.New("node")
	n := 0
	reg.SetSandboxes(func() []metrics.SandboxCount { n++; return []metrics.SandboxCount{{"running", "b", n}} })
	for want := 1; want <= 3; want++ {
		checkSamples(t, scrape(t, reg), map[string]string{
			`agentenv_sandboxes{role="node",state="running",template="b"}`: fmt.Sprint(want),
		})
	}
}

func TestHTTPMiddleware(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "missing" {
			http.Error(w, "no such sandbox", http.StatusNotFound)
			return
		}
		io.WriteString(w, "ok")
	})
	mux.HandleFunc("POST /sandboxes", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("DELETE /sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {}) // writes nothing: 200

	tests := []struct {
		name  string
		route func(*http.Request) string
		want  map[string]string
	}{
		{
			name: "route from ServeMux pattern",
			want: map[string]string{
				`agentenv_http_requests_total{code="200",role="api",route="GET /sandboxes/{id}"}`:      "2",
				`agentenv_http_requests_total{code="404",role="api",route="GET /sandboxes/{id}"}`:      "1",
				`agentenv_http_requests_total{code="201",role="api",route="POST /sandboxes"}`:          "1",
				`agentenv_http_requests_total{code="200",role="api",route="DELETE /sandboxes/{id}"}`:   "1",
				`agentenv_http_requests_total{code="404",role="api",route="unmatched"}`:                "1",
				`agentenv_http_request_duration_seconds_count{role="api",route="GET /sandboxes/{id}"}`: "3",
			},
		},
		{
			name:  "route function",
			route: func(r *http.Request) string { return r.Method },
			want: map[string]string{
				`agentenv_http_requests_total{code="200",role="api",route="GET"}`:    "2",
				`agentenv_http_requests_total{code="404",role="api",route="GET"}`:    "2",
				`agentenv_http_requests_total{code="201",role="api",route="POST"}`:   "1",
				`agentenv_http_requests_total{code="200",role="api",route="DELETE"}`: "1",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := metrics.New("api")
			h := reg.HTTPMiddleware(mux, tt.route)
			for _, req := range []struct{ method, path string }{
				{"GET", "/sandboxes/a"},
				{"GET", "/sandboxes/b"},
				{"GET", "/sandboxes/missing"},
				{"POST", "/sandboxes"},
				{"DELETE", "/sandboxes/a"},
				{"GET", "/nowhere"},
			} {
				h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(req.method, req.path, nil))
			}
			checkSamples(t, scrape(t, reg), tt.want)
		})
	}
}

// TestHTTPMiddlewareStreams checks a streamed response is not buffered: the
// client reads the first chunk while the handler is still blocked, and
// http.ResponseController still reaches the connection through the wrapper.
func TestHTTPMiddlewareStreams(t *testing.T) {
	reg := metrics.New("api")
	release := make(chan struct{})
	controllerErr := make(chan error, 1)
	h := reg.HTTPMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		controllerErr <- http.NewResponseController(w).SetWriteDeadline(time.Time{})
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "second\n")
	}), func(*http.Request) string { return "stream" })
	srv := httptest.NewServer(h)
	defer srv.Close()

	// The request and the read run aside so a buffered stream fails the
	// test instead of hanging it: without a flush, even the headers wait.
	first, done := make(chan string, 1), make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Get(srv.URL)
		if err != nil {
			first <- err.Error()
			return
		}
		defer resp.Body.Close()
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		first <- line
		io.Copy(io.Discard, resp.Body)
	}()
	select {
	case line := <-first:
		if line != "first\n" {
			t.Errorf("first chunk: got %q, want %q", line, "first\n")
		}
	case <-time.After(10 * time.Second): // guard only: a working flush answers at once
		t.Error("first chunk did not arrive while the handler was blocked: the middleware buffers the stream")
	}
	close(release)
	<-done
	if err := <-controllerErr; err != nil {
		t.Errorf("ResponseController.SetWriteDeadline through the middleware: %v", err)
	}
}

func TestProxyOp(t *testing.T) {
	tests := []struct {
		path string
		want string
	}{
		{"/process.Process/Start", metrics.OpExec},
		{"/process.Process/Connect", metrics.OpPort},
		{"/filesystem.Filesystem/ListDir", metrics.OpFiles},
		{"/filesystem.Filesystem/WatchDir", metrics.OpFiles},
		{"/files", metrics.OpFiles},
		{"/filesx", metrics.OpPort},
		{"/", metrics.OpPort},
		{"/api/health", metrics.OpPort},
	}
	for _, tt := range tests {
		if got := metrics.ProxyOp(httptest.NewRequest("POST", tt.path, nil)); got != tt.want {
			t.Errorf("ProxyOp(%s): got %q, want %q", tt.path, got, tt.want)
		}
	}
}

func TestNilRegistry(t *testing.T) {
	var reg *metrics.Registry
	reg.SetCause(cause)
	reg.ObserveOp(metrics.OpCreate, time.Second, errBusy)
	reg.SetSandboxes(func() []metrics.SandboxCount { return nil })
	reg.SetPools(func() metrics.Pools { return metrics.Pools{} })
	reg.Begin(metrics.OpExec)(nil)
	reg.SetCapacity(func() metrics.Capacity { return metrics.Capacity{} })
	reg.SetNodes(func() []metrics.NodeInfo { return nil })

	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	rec := httptest.NewRecorder()
	reg.HTTPMiddleware(next, nil).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusTeapot {
		t.Errorf("nil registry middleware: got status %d, want %d", rec.Code, http.StatusTeapot)
	}

	rec = httptest.NewRecorder()
	reg.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("nil registry /metrics: got status %d, want %d", rec.Code, http.StatusNotFound)
	}
}

// TestHostAndInFlight reads the host's CPU and memory from /proc and counts
// operations in flight until their done is called, concurrently.
func TestHostAndInFlight(t *testing.T) {
	reg := metrics.New("serve")
	got := scrape(t, reg)
	for _, series := range []string{
		`agentenv_host_cpus{role="serve"}`, `agentenv_host_memory_bytes{role="serve"}`,
		`agentenv_host_memory_available_bytes{role="serve"}`, `agentenv_host_cpu_seconds_total{mode="busy",role="serve"}`,
		`agentenv_host_cpu_seconds_total{mode="idle",role="serve"}`,
	} {
		if v, ok := got[series]; !ok || v == "0" {
			t.Errorf("%s: got %q, want a positive value", series, v)
		}
	}
	if _, ok := got[`agentenv_host_load1{role="serve"}`]; !ok {
		t.Error(`agentenv_host_load1{role="serve"}: absent`)
	}

	const n = 16
	dones := make([]func(error), n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { dones[i] = reg.Begin(metrics.OpCreate) })
	}
	wg.Wait()
	checkSamples(t, scrape(t, reg), map[string]string{`agentenv_operations_in_flight{op="create",role="serve"}`: "16"})
	for i, done := range dones {
		wg.Go(func() {
			if i%4 == 0 {
				done(errBusy)
			} else {
				done(nil)
			}
		})
	}
	wg.Wait()
	checkSamples(t, scrape(t, reg), map[string]string{
		`agentenv_operations_in_flight{op="create",role="serve"}`:                 "0",
		`agentenv_operation_duration_seconds_count{op="create",role="serve"}`:     "16",
		`agentenv_operation_errors_total{cause="error",op="create",role="serve"}`: "4",
	})
}

// TestHideTemplateNames: with template names hidden, no series names a
// template (tenants choose them) and every template's counts are summed
// under template="".
func TestHideTemplateNames(t *testing.T) {
	reg := metrics.New("serve")
	reg.SetSandboxes(func() []metrics.SandboxCount {
		return []metrics.SandboxCount{{State: "running", Template: "alice-secret-project", N: 2}, {State: "running", Template: "bob-py", N: 3}, {State: "paused", Template: "bob-py", N: 1}}
	})
	reg.SetPools(func() metrics.Pools {
		return metrics.Pools{Warm: map[string]int{"alice-secret-project": 1, "bob-py": 2}, Hot: map[string]int{"bob-py": 4}}
	})
	checkSamples(t, scrape(t, reg), map[string]string{
		`agentenv_sandboxes{role="serve",state="running",template="bob-py"}`: "3",
	})
	reg.HideTemplateNames()
	got := scrape(t, reg)
	checkSamples(t, got, map[string]string{
		`agentenv_sandboxes{role="serve",state="running",template=""}`:  "5",
		`agentenv_sandboxes{role="serve",state="paused",template=""}`:   "1",
		`agentenv_pool_sandboxes{pool="warm",role="serve",template=""}`: "3",
		`agentenv_pool_sandboxes{pool="hot",role="serve",template=""}`:  "4",
	})
	for series := range got {
		if strings.Contains(series, "alice") || strings.Contains(series, "bob") {
			t.Errorf("series %s names a template", series)
		}
	}
}
