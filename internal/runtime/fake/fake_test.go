package fake_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/fake"
	"github.com/agentenv/agentenv/internal/runtime/runtimetest"
)

// listenEnv makes the test binary a sandbox's init process that listens
// on the address it names until killed: a Go process, with many threads,
// as envd is.
const listenEnv = "FAKE_TEST_LISTEN"

func TestMain(m *testing.M) {
	if addr := os.Getenv(listenEnv); addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(1)
			}
			c.Close()
		}
	}
	os.Exit(m.Run())
}

// safeInit replaces the suite's init process: the fake runs it on the
// host, where the suite's writes to /tmp would land. It has a child, so
// that pause and destroy must reach the whole tree.
func safeInit(runtime.Spec) ([]string, error) {
	return []string{"/bin/sh", "-c", "sleep 100000 & wait"}, nil
}

func newFake(t *testing.T) *fake.Fake {
	f, err := fake.New(fake.Config{Root: filepath.Join(t.TempDir(), "state"), Command: safeInit})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestSuite runs the conformance suite on the fake runtime: as a normal
// user, with the checks that need Execer or Checkpointer skipped.
func TestSuite(t *testing.T) {
	dir := t.TempDir()
	image := filepath.Join(dir, "image.erofs")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	runtimetest.Run(t, runtimetest.Env{Image: image, Dir: dir}, func(t *testing.T) runtime.Runtime { return newFake(t) })
}

// Pause stops the init process's children too, and destroy kills them.
func TestPauseAndDestroyReachChildren(t *testing.T) {
	ctx := context.Background()
	f := newFake(t)
	dir := t.TempDir()
	image := filepath.Join(dir, "image")
	os.WriteFile(image, nil, 0o600)
	s := runtime.Spec{ID: "fake0000000000000001", Dir: dir, Image: image}
	if err := f.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Destroy(ctx, s.ID) })
	child := waitChild(t, s)
	if err := f.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if st := state(child); st != "T" {
		t.Errorf("child of a paused sandbox is %q, want T (stopped)", st)
	}
	if err := f.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if st := state(child); st == "T" {
		t.Errorf("child of a resumed sandbox is still stopped")
	}
	if err := f.Destroy(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for st := state(child); st != "" && st != "Z"; st = state(child) {
		if time.Now().After(deadline) {
			t.Fatalf("child of a destroyed sandbox is %q, want gone", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitChild returns the PID of the sleep the init process started.
func waitChild(t *testing.T, s runtime.Spec) int {
	t.Helper()
	wd := fake.WorkDir(s)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cwd, _ := os.Readlink("/proc/" + e.Name() + "/cwd")
			cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if cwd == wd && strings.HasPrefix(string(cmd), "sleep\x00") {
				return pid
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the init process's child did not start")
	return 0
}

// state is the state letter of a process, "" when it is gone.
func state(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return f[0]
}

// Once Destroy returns, what the sandbox's processes held is free: the
// address its init process listened on can be bound again at once (the
// manager gives the sandbox's network slot, and so its address, to the
// next sandbox right after the destroy).
func TestDestroyReleasesTheListeningAddress(t *testing.T) {
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	f, err := fake.New(fake.Config{Root: filepath.Join(t.TempDir(), "state"), Command: func(runtime.Spec) ([]string, error) {
		return []string{os.Args[0]}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	image := filepath.Join(dir, "image")
	os.WriteFile(image, nil, 0o600)
	// A killed process's threads exit one by one: one in a few destroys
	// used to return while the socket was still open.
	const rounds = 30
	for i := range rounds {
		s := runtime.Spec{ID: fmt.Sprintf("fake%016d", i), Dir: filepath.Join(dir, strconv.Itoa(i)), Image: image,
			Env: []string{listenEnv + "=" + addr}}
		if err := f.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		waitListening(t, addr)
		if err := f.Destroy(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("round %d: listen on %s right after Destroy: got %v, want the address free", i, addr, err)
		}
		l.Close()
	}
}

// waitListening polls until something accepts connections at addr.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s: %v", addr, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
