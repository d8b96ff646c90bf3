// Package testenv holds helpers for tests that need root, gVisor or other
// parts of the host. Locally such tests skip with a reason; with
// AGENTENV_REQUIRE_ROOT=1 (set by `make test` and CI) a missing requirement
// fails the test instead, so CI can never pass by skipping.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Required reports whether missing requirements must fail tests.
func Required() bool { return os.Getenv("AGENTENV_REQUIRE_ROOT") == "1" }

func missing(t testing.TB, reason string) {
	t.Helper()
	if Required() {
		t.Fatalf("requirement missing (AGENTENV_REQUIRE_ROOT=1): %s", reason)
	}
	t.Skipf("skipping: %s (run `make test` as root to run it)", reason)
}

// NeedRoot skips (or fails, in CI) unless the test runs as root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if testing.Short() && !Required() {
		t.Skip("skipping in -short mode: needs root")
	}
	if os.Geteuid() != 0 {
		missing(t, "needs root")
	}
}

// NeedRunsc skips (or fails) unless root and runsc are available, and
// returns the runsc path.
func NeedRunsc(t testing.TB) string {
	t.Helper()
	NeedRoot(t)
	p, err := exec.LookPath("runsc")
	if err != nil {
		missing(t, "needs runsc (make setup installs the pinned build)")
	}
	return p
}

// NeedCommand skips (or fails) unless a command is on PATH.
func NeedCommand(t testing.TB, name, why string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		missing(t, name+" not found: "+why)
	}
	return p
}

// RepoRoot returns the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// BuildEnvd builds the envd binary into dir and returns its path.
func BuildEnvd(t testing.TB, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "envd")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/envd")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build envd: %v\n%s", err, b)
	}
	return out
}

// BuildCodeInterp builds the code interpreter server (cmd/codeinterp)
// into dir, where a server whose envd is in dir finds it, and returns its path.
func BuildCodeInterp(t testing.TB, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "codeinterp")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/codeinterp")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build codeinterp: %v\n%s", err, b)
	}
	return out
}

// BuildAgentenv builds the agentenv binary (and envd next to it) into dir
// and returns the agentenv path.
func BuildAgentenv(t testing.TB, dir string) string {
	t.Helper()
	BuildEnvd(t, dir)
	out := filepath.Join(dir, "agentenv")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/agentenv")
	cmd.Dir = RepoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build agentenv: %v\n%s", err, b)
	}
	return out
}

// gnuTools are the host programs GNURootfs copies: bash, coreutils, tar,
// findutils, grep and sed, the userland of a Debian template.
var gnuTools = []string{
	"bash", "cat", "chmod", "chown", "cp", "date", "dd", "df", "du", "echo", "env", "false",
	"find", "grep", "head", "id", "ln", "ls", "mkdir", "mv", "od", "printf", "readlink", "rm",
	"sed", "sleep", "sort", "stat", "sync", "tail", "tar", "test", "touch", "tr", "true",
	"truncate", "uname", "wc", "xargs", "yes",
}

// GNURootfs assembles in dir a small root filesystem of the host's GNU
// userland (gnuTools, bash as /bin/sh) and the shared libraries they load
// (found with ldd), laid out as Debian's: /bin, /sbin, /lib and /lib64 are
// links into /usr. It stands in for a debootstrapped template, which takes
// minutes to build, wherever busybox's tools would hide a difference.
func GNURootfs(t testing.TB, dir string) {
	t.Helper()
	NeedCommand(t, "ldd", "lists the libraries of the GNU tools")
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(dir, l)); err != nil {
			t.Fatal(err)
		}
	}
	libs := map[string]bool{}
	for _, name := range gnuTools {
		p, err := exec.LookPath(name)
		if err != nil {
			missing(t, name+" not found: the GNU test template needs it")
		}
		copyFile(t, p, filepath.Join(dir, "usr/bin", name), 0o755)
		out, err := exec.Command("ldd", p).Output()
		if err != nil {
			t.Fatalf("ldd %s: %v", p, err)
		}
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			for i, w := range f {
				if strings.HasPrefix(w, "/") && (i == 0 || f[i-1] == "=>") {
					libs[w] = true
				}
			}
		}
	}
	for lib := range libs {
		copyFile(t, lib, filepath.Join(dir, lib), 0o755)
	}
	if err := os.Symlink("bash", filepath.Join(dir, "usr/bin/sh")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "etc/os-release"), []byte("NAME=\"agentenv GNU test template\"\n"), 0o644)
}

// copyFile copies the host file src (a link's target) to dst, whose
// directories it makes, with src's modification time: a template's files
// are older than its sandboxes, as the packages' are.
func copyFile(t testing.TB, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(dst, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
}

// ServeAddrs waits until the log at logPath, read from offset from, has
// the line of an `agentenv serve` started with `--listen 127.0.0.1:0
// --proxy-listen 127.0.0.1:0`, and returns the API's and the proxy's
// addresses. Tests start servers on port 0 and read the ports back: a port
// found free and closed before the server binds it can be taken by
// another test meanwhile (the server binds after preparing its host,
// seconds later).
func ServeAddrs(t testing.TB, logPath string, from int64, timeout time.Duration) (api, proxy string) {
	t.Helper()
	a := ServingAddrs(t, logPath, from, "agentenv", timeout)
	return a.API, a.Proxy
}

// Addrs are the addresses a server logs once it serves.
type Addrs struct{ API, Proxy, ProxyTLS string }

// ServingAddrs is ServeAddrs for any role that logs through
// server.Front.Serve: what is its name there ("agentenv", "agentenv api"),
// and ProxyTLS is empty without an HTTPS proxy.
func ServingAddrs(t testing.TB, logPath string, from int64, what string, timeout time.Duration) Addrs {
	t.Helper()
	// slog's text format; an empty value is written "".
	line := regexp.MustCompile(`msg="` + regexp.QuoteMeta(what) + ` serving" api=(\S+) proxy=(\S+) proxyTLS=(\S+)`)
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(logPath); err == nil && int64(len(b)) > from {
			if m := line.FindSubmatch(b[from:]); m != nil {
				return Addrs{API: string(m[1]), Proxy: string(m[2]), ProxyTLS: strings.Trim(string(m[3]), `"`)}
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("%s did not serve within %s; log:\n%s", what, timeout, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DropFirewall deletes the nftables table of the server whose network tag
// is tag, once its test is done with it. A server keeps its table when it
// stops (its sandboxes may outlive it), so without this every test server
// leaves one behind, and a later server on the same addresses with another
// tag has its connections to sandboxes refused by the old rules.
func DropFirewall(tag string) error {
	table := "agentenv" + tag
	if err := exec.Command("nft", "list", "table", "inet", table).Run(); err != nil {
		return nil // none, or no nft
	}
	if out, err := exec.Command("nft", "delete", "table", "inet", table).CombinedOutput(); err != nil {
		return fmt.Errorf("removing the test server's firewall table %s: %v: %s", table, err, out)
	}
	return nil
}
