// Command agentenv is the agentenv server and CLI (see internal/cli).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"agentenv/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
