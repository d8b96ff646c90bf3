package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestHelpPrintsNoSecret: a key in the environment must never appear in
// help output (it used to be shown as the default of --api-key).
func TestHelpPrintsNoSecret(t *testing.T) {
	const secret = "sk-very-secret-key-4242"
	t.Setenv("AGENTENV_API_KEY", secret)
	for _, args := range [][]string{{"--help"}, {"sandbox", "create", "--help"}, {"serve", "--help"}, {"template", "build", "--help"}} {
		root := Root()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if strings.Contains(out.String(), secret) {
			t.Errorf("%v: help output contains the API key:\n%s", args, out.String())
		}
	}
}
