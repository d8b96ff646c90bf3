// Package cli is the agentenv command line: `serve` runs the service, the
// other commands talk to a running server through the client package.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentenv/agentenv/client"
)

// ExitError carries a specific exit code out of a command.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

type globals struct {
	server  string
	proxy   string
	apiKey  string
	dataDir string
	json    bool
}

// Root returns the agentenv command tree.
func Root() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "agentenv",
		Short:         "Sandboxes for training and evaluating AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.server, "server", envOr("AGENTENV_SERVER", "http://127.0.0.1:3000"), "API server URL (env AGENTENV_SERVER)")
	pf.StringVar(&g.proxy, "proxy", envOr("AGENTENV_PROXY", ""), "sandbox proxy URL (env AGENTENV_PROXY; default: the server's host, port 3001)")
	// The default stays empty so that help never prints a secret; client()
	// reads the environment at run time.
	pf.StringVar(&g.apiKey, "api-key", "", "API key (default: env AGENTENV_API_KEY, else E2B_API_KEY, else the key file in --data-dir when readable)")
	pf.StringVar(&g.dataDir, "data-dir", envOr("AGENTENV_DATA_DIR", "/var/lib/agentenv"), "data directory (env AGENTENV_DATA_DIR)")
	pf.BoolVar(&g.json, "json", false, "print JSON instead of tables")
	root.AddCommand(serveCmd(g), nodeCmd(g), apiCmd(g), etcdCmd(), sandboxCmd(g), templateCmd(g), snapshotCmd(g), benchCmd(g))
	strict(root)
	return root
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// client builds an API client from the global flags.
func (g *globals) client() (*client.Client, error) {
	// --api-key, AGENTENV_API_KEY, E2B_API_KEY, then the server's key
	// file when this user may read it (root: the host owner's key).
	key := g.apiKey
	for _, env := range []string{"AGENTENV_API_KEY", "E2B_API_KEY"} {
		if key == "" {
			key = os.Getenv(env)
		}
	}
	if key == "" {
		b, err := os.ReadFile(filepath.Join(g.dataDir, "api-key"))
		if err != nil {
			return nil, fmt.Errorf("no API key: set AGENTENV_API_KEY (or E2B_API_KEY) or --api-key (the server stores its own key in %s/api-key, readable by root only; on a shared server ask its operator for a named key)", g.dataDir)
		}
		key = strings.TrimSpace(string(b))
	}
	proxy := g.proxy
	if proxy == "" {
		proxy = strings.Replace(g.server, ":3000", ":3001", 1)
	}
	return client.New(g.server, proxy, key), nil
}

func (g *globals) printJSON(w io.Writer, v any) error {
	// An empty list is [], never null: scripts iterate over it.
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice && rv.IsNil() {
		v = []any{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer, header string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

// Main runs the CLI and returns the process exit code.
func Main(ctx context.Context, args []string) int {
	root := Root()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	var ue *usageError
	if errors.As(err, &ue) {
		if ue.dashDash {
			if line := dashDashLine(ue.cmd, args); line != "" {
				ue.hint = dashDashHint + line
			}
		}
		fmt.Fprintln(os.Stderr, "error:", ue)
		return 2
	}
	printError(os.Stderr, err)
	var ce *client.Error
	if errors.As(err, &ce) {
		switch {
		case ce.Status == 404:
			return 3
		case ce.Status >= 400 && ce.Status < 500:
			return 2
		}
	}
	return 1
}

// causeHints say, beside an error, what ended the sandbox or the command
// (client.Cause) and what to do, as the Python SDK's exception.cause does.
var causeHints = map[string]string{
	client.CauseOOM:            "out of memory: give the sandbox more memory (sandbox create --memory-mb), or make the command use less",
	client.CauseLost:           "the sandbox died on its own: create a new one",
	client.CauseSandboxTimeout: "the sandbox reached its timeout: create it with a longer --timeout",
	client.CauseKilled:         "the sandbox was killed",
	client.CauseCommandTimeout: "the command reached its --timeout and was killed",
}

// printError prints err and, when it says what ended the sandbox or the
// command, a line naming the cause.
func printError(w io.Writer, err error) {
	fmt.Fprintln(w, "error:", err)
	if c := client.Cause(err); c != "" {
		fmt.Fprintf(w, "cause: %s (%s)\n", c, causeHints[c])
	}
}
