// Command agentenv is the agentenv server and CLI (see internal/cli).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentenv/agentenv/internal/cli"
	"github.com/agentenv/agentenv/internal/runtime/gvisorgo"
)

func main() {
	// Before anything else: a re-execution of this binary as a gVisor
	// worker (creates and restores sandboxes for the server) never returns.
	gvisorgo.WorkerMain()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
