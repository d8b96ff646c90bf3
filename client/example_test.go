package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/agentenv/agentenv/client"
)

// These examples talk to a running server (`agentenv serve`, or `make
// demo`), so they are compiled but not run by `go test`.

// newClient reads the server's address and key as the CLI does.
func newClient() *client.Client {
	server := os.Getenv("AGENTENV_SERVER")
	if server == "" {
		server = "http://127.0.0.1:3000"
	}
	return client.New(server, strings.Replace(server, ":3000", ":3001", 1), os.Getenv("AGENTENV_API_KEY"))
}

// Create a sandbox, run a command in it and kill it.
func Example() {
	ctx := context.Background()
	c := newClient()
	timeout := int64(60) // seconds
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: &timeout})
	if err != nil {
		log.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.SandboxID)
	res, err := c.Exec(ctx, sb, "echo", []string{"hello from", sb.SandboxID}, nil, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d: %s", res.ExitCode, res.Stdout)
}

// Stream a command's output as it runs, with a time limit enforced inside
// the sandbox.
func ExampleClient_StartProcess() {
	ctx := context.Background()
	c := newClient()
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.SandboxID)
	p, err := c.StartProcess(ctx, sb, client.ProcessRequest{
		Cmd: "/bin/sh", Args: []string{"-c", "for i in 1 2 3; do echo $i; sleep 1; done"},
		Timeout: 10 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	res, err := p.Wait(os.Stdout, os.Stderr) // lines appear as they are printed
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", res.ExitCode)
}

// Write a file into a sandbox, read it back and copy a directory out.
func ExampleFiles() {
	ctx := context.Background()
	c := newClient()
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.SandboxID)
	fs := c.Files(sb, "") // as envd's default user
	if err := fs.Write(ctx, "/tmp/work/notes.txt", strings.NewReader("hello\n")); err != nil {
		log.Fatal(err)
	}
	b, err := c.ReadFile(ctx, sb, "/tmp/work/notes.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s", b)
	if err := fs.CopyFrom(ctx, "/tmp/work", os.TempDir(), func(w string) { log.Print(w) }); err != nil {
		log.Fatal(err)
	}
}

// Drive a terminal: type a command, read the screen until the shell exits.
func ExampleClient_StartPTY() {
	ctx := context.Background()
	c := newClient()
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.SandboxID)
	t, err := c.StartPTY(ctx, sb, client.PTYRequest{Cmd: "/bin/sh", Cols: 120, Rows: 40})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	if err := t.Write(ctx, []byte("uname -a; exit\n")); err != nil {
		log.Fatal(err)
	}
	code, err := t.Output(os.Stdout)
	fmt.Println("exit", code, err)
}

// Snapshot a sandbox, then start a new one from the snapshot: it has the
// first one's memory, processes and files.
func ExampleClient_SnapshotSandbox() {
	ctx := context.Background()
	c := newClient()
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.SandboxID)
	if err := c.WriteFile(ctx, sb, "/tmp/state", strings.NewReader("step 1")); err != nil {
		log.Fatal(err)
	}
	sn, err := c.SnapshotSandbox(ctx, sb.SandboxID, "after-step-1", nil)
	if err != nil {
		log.Fatal(err)
	}
	restored, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: sn.SnapshotID})
	if err != nil {
		log.Fatal(err)
	}
	defer c.KillSandbox(ctx, restored.SandboxID)
	b, _ := c.ReadFile(ctx, restored, "/tmp/state")
	fmt.Printf("%s\n", b)
}

// Fork a running sandbox into children that each continue from its state,
// e.g. to try several actions from one point of an episode.
func ExampleClient_ForkSandbox() {
	ctx := context.Background()
	c := newClient()
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.SandboxID)
	children, errs, err := c.ForkSandbox(ctx, sb.SandboxID, 4)
	if err != nil {
		log.Fatal(err)
	}
	for i, child := range children {
		if errs[i] != nil {
			log.Printf("child %d: %v", i, errs[i])
			continue
		}
		defer c.KillSandbox(ctx, child.SandboxID)
		res, _ := c.Exec(ctx, child, "/bin/sh", []string{"-c", fmt.Sprintf("echo action %d", i)}, nil, nil)
		fmt.Printf("%s: %s", child.SandboxID, res.Stdout)
	}
}

// Pause a sandbox and bring it back with connect, which resumes a paused
// sandbox and gives it at least the timeout asked for.
func ExampleClient_ConnectSandbox() {
	ctx := context.Background()
	c := newClient()
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.SandboxID)
	if err := c.PauseSandbox(ctx, sb.SandboxID); err != nil {
		log.Fatal(err)
	}
	timeout := int64(300) // seconds
	sb, err = c.ConnectSandbox(ctx, sb.SandboxID, client.ConnectRequest{Timeout: &timeout})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sb.State, "until", sb.EndAt)
}
