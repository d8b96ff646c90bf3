// Command codeinterp is the code interpreter server inside a
// code-interpreter-v1 sandbox: E2B's code interpreter API on port 49999,
// backed by IPython kernels. With -check it asks a running server's
// /health and exits 0 once it answers (the template's ready check).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/codeinterp"
)

func main() {
	listen := flag.String("listen", "0.0.0.0:"+strconv.Itoa(codeinterp.Port), "address to serve on")
	python := flag.String("python", "python3", "Python interpreter with ipykernel")
	stateDir := flag.String("state-dir", "", "directory for kernel connection files and sockets (default: one in /tmp)")
	cwd := flag.String("cwd", "", "working directory of a context that names none (default: home)")
	envd := flag.String("envd", "http://127.0.0.1:49983", "envd's address, asked for the sandbox's variables (empty: not asked)")
	check := flag.Bool("check", false, "ask the server at -listen for /health and exit 0 if it is ready")
	flag.Parse()
	if *check {
		os.Exit(runCheck(*listen))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log, *listen, codeinterp.Config{Python: *python, StateDir: *stateDir, Cwd: *cwd, EnvdURL: *envd, Log: log}); err != nil {
		fmt.Fprintln(os.Stderr, "codeinterp:", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, listen string, cfg codeinterp.Config) error {
	s, err := codeinterp.New(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("start the default python context: %w", err)
	}
	log.Info("code interpreter serving", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return srv.Close()
	}
}

func runCheck(listen string) int {
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return 2
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + port + "/health")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, resp.Status)
		return 1
	}
	return 0
}
