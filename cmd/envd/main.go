// Command envd is the daemon inside every sandbox (see internal/envd).
//
// Its Go runtime skips three things it would do under gVisor for nothing
// (docs/design.md, "envd's start inside gVisor"): naming each anonymous
// mapping (a prctl per mmap, which gVisor refuses), reading the cgroup's
// CPU limit at start (gVisor already sizes the CPUs it shows to the
// sandbox's quota), and reading it again every second afterwards.
//
//go:debug decoratemappings=0
//go:debug containermaxprocs=0
//go:debug updatemaxprocs=0
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/agentenv/agentenv/internal/envd"
	"github.com/agentenv/agentenv/internal/envd/listener"
)

var defaultAddr = fmt.Sprintf("0.0.0.0:%d", envd.Port)

func main() {
	addr := flag.String("listen", defaultAddr, "address to serve on")
	maxUpload := flag.Int64("max-upload", 1<<30, "largest POST /files body in bytes")
	version := flag.Bool("version", false, "print the version and exit")
	user := flag.String("user", "", "default user of commands and file operations (default \"user\")")
	workdir := flag.String("workdir", "", "default working directory of commands (default: the user's home)")
	changesRoot := flag.String("changes-root", "/", "tree a pause without memory saves and restores (tests running envd on the host)")
	memGuard := flag.Bool("memory-guard", true, "kill the biggest process before the sandbox's memory limit is reached (only when envd is the sandbox's init)")
	flag.Parse()
	if *version {
		fmt.Println(envd.Version)
		return
	}
	token := os.Getenv(envd.TokenEnv)
	os.Unsetenv(envd.TokenEnv)
	envs := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, ok := strings.Cut(kv, "=")
		// The runtime sets HOME (and may set PWD) for envd itself; each
		// command gets its own user's instead.
		if ok && k != "HOME" && k != "PWD" {
			envs[k] = v
		}
	}
	// PID 1 of the sandbox: orphaned processes become envd's to reap.
	envd.ReapOrphans()
	// The guard kills processes by memory use, so it runs only as the
	// sandbox's init, where every process is the sandbox's: never on a
	// host (the unprivileged tests run envd there).
	var guard *envd.MemoryGuard
	if *memGuard && os.Getpid() == 1 {
		guard = &envd.MemoryGuard{Proc: "/proc", Self: os.Getpid(), Log: log.Default()}
		go func() { log.Printf("envd: memory guard stopped: %v", guard.Run(context.Background())) }()
	}
	srv := envd.New(envd.Config{AccessToken: token, Envs: envs, MaxUpload: *maxUpload, DefaultUser: *user, DefaultWorkdir: *workdir, ChangesRoot: *changesRoot, Guard: guard})
	ln, err := listen(*addr, listener.Take())
	if err != nil {
		log.Fatalf("envd: %v", err)
	}
	hs := &http.Server{Handler: srv.Handler(), Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	log.Printf("envd %s serving on %s", envd.Version, ln.Addr())
	log.Fatal(hs.Serve(ln))
}

// listen returns the socket the listener package opened at start when addr
// is the default, else a new one on addr.
func listen(addr string, early *os.File) (net.Listener, error) {
	if early != nil {
		defer early.Close()
		if addr == defaultAddr {
			return net.FileListener(early)
		}
	}
	return net.Listen("tcp", addr)
}
