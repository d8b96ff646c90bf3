package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

var allStates = []State{StateCreating, StateRunning, StatePaused, StatePausedFiles, StateKilling, StateLost}

func TestCanMove(t *testing.T) {
	allowed := map[[2]State]bool{
		{StateCreating, StateRunning}:    true,
		{StateCreating, StateKilling}:    true,
		{StateRunning, StatePaused}:      true,
		{StateRunning, StateKilling}:     true,
		{StatePaused, StateRunning}:      true,
		{StatePaused, StateKilling}:      true,
		{StateRunning, StatePausedFiles}: true,
		{StatePausedFiles, StateRunning}: true,
		{StatePausedFiles, StateKilling}: true,
	}
	for _, from := range allStates {
		for _, to := range allStates {
			want := allowed[[2]State{from, to}]
			if got := canMove(from, to); got != want {
				t.Errorf("canMove(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
	if canMove("", StateRunning) || canMove("bogus", StateKilling) {
		t.Error("an unknown state can move, want no transitions from it")
	}
}

// What each state allows, and what E2B's API shows of it.
func TestStateRules(t *testing.T) {
	for _, tt := range []struct {
		s                       State
		paused, live, container bool
		e2b                     State
	}{
		{StateCreating, false, false, true, StateCreating},
		{StatePooled, false, false, true, StatePooled},
		{StateRunning, false, true, true, StateRunning},
		{StatePaused, true, true, true, StatePaused},
		{StatePausedFiles, true, true, false, StatePaused},
		{StateKilling, false, false, false, StateKilling},
		{StateLost, false, false, false, StateLost},
	} {
		if got := tt.s.Paused(); got != tt.paused {
			t.Errorf("%s.Paused() = %v, want %v", tt.s, got, tt.paused)
		}
		if got := tt.s.Live(); got != tt.live {
			t.Errorf("%s.Live() = %v, want %v", tt.s, got, tt.live)
		}
		if got := tt.s.hasContainer(); got != tt.container {
			t.Errorf("%s.hasContainer() = %v, want %v", tt.s, got, tt.container)
		}
		if got := tt.s.E2B(); got != tt.e2b {
			t.Errorf("%s.E2B() = %s, want %s", tt.s, got, tt.e2b)
		}
	}
	for _, s := range allStates {
		if _, ok := states[s]; !ok {
			t.Errorf("state %s has no rules", s)
		}
	}
}

// Records written before StatePausedFiles said "paused" with "filesOnly":
// they load as paused-files, from disk and inside an etcd record; new
// records round-trip; a plain paused record stays paused.
func TestOldFilesOnlyRecordLoads(t *testing.T) {
	for _, tt := range []struct {
		name, json string
		want       State
	}{
		{"old files-only", `{"sandboxID":"i1","state":"paused","filesOnly":true}`, StatePausedFiles},
		{"old paused", `{"sandboxID":"i1","state":"paused"}`, StatePaused},
		{"new", `{"sandboxID":"i1","state":"paused-files"}`, StatePausedFiles},
		{"running with a stray flag", `{"sandboxID":"i1","state":"running","filesOnly":true}`, StateRunning},
	} {
		var sb Sandbox
		if err := json.Unmarshal([]byte(tt.json), &sb); err != nil || sb.State != tt.want || sb.ID != "i1" {
			t.Errorf("%s: got %q %s (%v), want i1 %s", tt.name, sb.ID, sb.State, err, tt.want)
		}
		var rec struct {
			Node    string  `json:"node"`
			Sandbox Sandbox `json:"sandbox"`
		}
		if err := json.Unmarshal([]byte(`{"node":"n1","sandbox":`+tt.json+`}`), &rec); err != nil || rec.Sandbox.State != tt.want || rec.Node != "n1" {
			t.Errorf("%s in an etcd record: got %+v (%v), want state %s", tt.name, rec, err, tt.want)
		}
	}
	b, _ := json.Marshal(Sandbox{ID: "i1", State: StatePausedFiles})
	var back Sandbox
	if err := json.Unmarshal(b, &back); err != nil || back.State != StatePausedFiles {
		t.Errorf("round trip of %s: got %s (%v)", b, back.State, err)
	}
}

// Recovery adopts a sandbox paused without memory from a record the old
// code wrote, as paused-files.
func TestRecoverOldFilesOnlyRecord(t *testing.T) {
	dir := t.TempDir()
	envdBin := filepath.Join(dir, "envd")
	os.WriteFile(envdBin, []byte("envd"), 0o755)
	os.MkdirAll(filepath.Join(dir, "templates", "img"), 0o755)
	os.WriteFile(filepath.Join(dir, "templates", "img", "template.json"), []byte(`{"name":"img"}`), 0o644)
	store, err := template.Open(filepath.Join(dir, "templates"), envdBin, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Deps{Dir: filepath.Join(dir, "sandboxes"), Templates: store, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	os.MkdirAll(m.rec.filesDir(id), 0o700)
	os.WriteFile(filepath.Join(m.rec.filesDir(id), filesArchive), nil, 0o600)
	old := `{"sandboxID":"` + id + `","templateID":"img","state":"paused","filesOnly":true,"slot":{}}`
	os.WriteFile(filepath.Join(m.rec.dir(id), "sandbox.json"), []byte(old), 0o600)
	sb, err := m.rec.read(id)
	if err != nil {
		t.Fatal(err)
	}
	if !m.adoptFilesOnly(sb) {
		t.Fatalf("record %s was not adopted as paused without memory", old)
	}
	got, err := m.Get(id)
	if err != nil || got.State != StatePausedFiles || got.State.E2B() != StatePaused {
		t.Errorf("adopted sandbox: %s (%v), want paused-files, shown as paused", got.State, err)
	}
}

func readState(t *testing.T, dir, id string) State {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, id, "sandbox.json"))
	if err != nil {
		t.Fatalf("record: %v", err)
	}
	var sb Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		t.Fatalf("record %s: %v", b, err)
	}
	return sb.State
}

func TestMovePersists(t *testing.T) {
	dir := t.TempDir()
	m, err := New(Deps{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	if err := os.MkdirAll(m.rec.dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	e := newEntry(Sandbox{ID: id, State: StateCreating}, nil)
	if err := m.rec.write(e.sb); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		to State
		ok bool
	}{
		{StatePaused, false}, // not yet running
		{StateRunning, true},
		{StateRunning, false},
		{StatePaused, true},
		{StateRunning, true},
		{StateKilling, true},
		{StateRunning, false}, // killing is final
		{StateKilling, false},
	}
	for i, s := range steps {
		before := e.sb.State
		err := m.rec.move(e, s.to)
		if (err == nil) != s.ok {
			t.Fatalf("step %d: move %s → %s = %v, want ok=%v", i, before, s.to, err, s.ok)
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrConflict) {
				t.Errorf("step %d: move %s → %s = %v, want ErrConflict", i, before, s.to, err)
			}
			if e.sb.State != before {
				t.Errorf("step %d: refused move changed the state to %s", i, e.sb.State)
			}
		}
		if got := readState(t, dir, id); got != e.sb.State {
			t.Errorf("step %d: persisted state %s, want %s", i, got, e.sb.State)
		}
	}
	// Only the record is left; no temporary file.
	entries, _ := os.ReadDir(m.rec.dir(id))
	if len(entries) != 1 || entries[0].Name() != "sandbox.json" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("sandbox directory holds %q, want only sandbox.json", names)
	}
}

func TestLimitsCheck(t *testing.T) {
	l := DefaultLimits()
	tests := []struct {
		name string
		req  CreateRequest
		want CreateRequest // after defaults, when ok
		ok   bool
	}{
		{"defaults", CreateRequest{Template: "base"},
			CreateRequest{Template: "base", Timeout: l.DefaultTimeout, CPUs: l.DefaultCPUs, MemoryMB: l.DefaultMemMB}, true},
		{"explicit values kept", CreateRequest{Template: "base", Timeout: time.Minute, CPUs: 1, MemoryMB: 64},
			CreateRequest{Template: "base", Timeout: time.Minute, CPUs: 1, MemoryMB: 64}, true},
		{"maximums", CreateRequest{Template: "base", Timeout: l.MaxTimeout, CPUs: l.MaxCPUs, MemoryMB: l.MaxMemMB},
			CreateRequest{Template: "base", Timeout: l.MaxTimeout, CPUs: l.MaxCPUs, MemoryMB: l.MaxMemMB}, true},
		{"env vars", CreateRequest{Template: "base", EnvVars: map[string]string{"A": "1", "lower_case": "x y"}},
			CreateRequest{Template: "base", Timeout: l.DefaultTimeout, CPUs: l.DefaultCPUs, MemoryMB: l.DefaultMemMB, EnvVars: map[string]string{"A": "1", "lower_case": "x y"}}, true},
		{"no template", CreateRequest{}, CreateRequest{}, false},
		{"negative timeout", CreateRequest{Template: "base", Timeout: -time.Second}, CreateRequest{}, false},
		{"timeout too long", CreateRequest{Template: "base", Timeout: l.MaxTimeout + time.Second}, CreateRequest{}, false},
		{"negative cpus", CreateRequest{Template: "base", CPUs: -1}, CreateRequest{}, false},
		{"too many cpus", CreateRequest{Template: "base", CPUs: l.MaxCPUs + 1}, CreateRequest{}, false},
		{"too little memory", CreateRequest{Template: "base", MemoryMB: 63}, CreateRequest{}, false},
		{"negative memory", CreateRequest{Template: "base", MemoryMB: -512}, CreateRequest{}, false},
		{"too much memory", CreateRequest{Template: "base", MemoryMB: l.MaxMemMB + 1}, CreateRequest{}, false},
		{"empty env name", CreateRequest{Template: "base", EnvVars: map[string]string{"": "x"}}, CreateRequest{}, false},
		{"env name with =", CreateRequest{Template: "base", EnvVars: map[string]string{"A=B": "x"}}, CreateRequest{}, false},
		{"env name with NUL", CreateRequest{Template: "base", EnvVars: map[string]string{"A\x00": "x"}}, CreateRequest{}, false},
		{"env name too long", CreateRequest{Template: "base", EnvVars: map[string]string{strings.Repeat("A", 257): "x"}}, CreateRequest{}, false},
		// A NUL in a value cannot be passed to execve: every command in
		// the sandbox would then fail to start.
		{"env value with NUL", CreateRequest{Template: "base", EnvVars: map[string]string{"A": "x\x00y"}}, CreateRequest{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req
			err := l.check(&req)
			if (err == nil) != tt.ok {
				t.Fatalf("check(%+v) = %v, want ok=%v", tt.req, err, tt.ok)
			}
			if err != nil {
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Errorf("check(%+v) = %v, want an ErrInvalid", tt.req, err)
				}
				return
			}
			if req.Template != tt.want.Template || req.Timeout != tt.want.Timeout || req.CPUs != tt.want.CPUs || req.MemoryMB != tt.want.MemoryMB || len(req.EnvVars) != len(tt.want.EnvVars) {
				t.Errorf("after check: got %+v, want %+v", req, tt.want)
			}
		})
	}
}

func TestCheckTimeout(t *testing.T) {
	l := DefaultLimits()
	tests := []struct {
		d  time.Duration
		ok bool
	}{
		{time.Second, true},
		{l.MaxTimeout, true},
		{0, true}, // E2B's set_timeout(0): the timeout action now
		{-time.Second, false},
		{l.MaxTimeout + 1, false},
	}
	for _, tt := range tests {
		err := l.checkTimeout(tt.d)
		if (err == nil) != tt.ok {
			t.Errorf("checkTimeout(%v) = %v, want ok=%v", tt.d, err, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("checkTimeout(%v) = %v, want an ErrInvalid", tt.d, err)
		}
	}
}

func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := newID()
		// runsc matches container IDs by prefix: all IDs have one length.
		if len(id) != 21 || id[0] != 'i' || strings.Trim(id[1:], "0123456789abcdef") != "" {
			t.Fatalf("got ID %q, want 'i' and 20 hex digits", id)
		}
		if seen[id] {
			t.Fatalf("ID %q repeated", id)
		}
		seen[id] = true
	}
}

func TestUndoKindsAndFloor(t *testing.T) {
	m := testManager(t, newFakeRuntime(), 10)
	var order []string
	u := undo{id: newID()}
	for _, name := range []string{"a", "b", "c", "d"} {
		u.push(undoStep{kind: undoRelease, name: name, fn: func() { order = append(order, name) }})
	}
	u.push(undoStep{kind: undoContainer})
	if err := m.reap.runUndo(context.Background(), &u, 0, undoContainer); err != nil || len(order) != 0 || len(u.steps) != 4 {
		t.Fatalf("only the container: err %v, released %v, %d steps left; want nil, none, 4", err, order, len(u.steps))
	}
	if err := m.reap.runUndo(context.Background(), &u, 2); err != nil || len(u.steps) != 2 {
		t.Fatalf("above the floor: err %v, %d steps left; want nil, 2", err, len(u.steps))
	}
	if err := m.reap.runUndo(context.Background(), &u, 0); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(order, ""), "dcba"; got != want {
		t.Errorf("got order %q, want %q (the reverse of the pushes)", got, want)
	}
}
