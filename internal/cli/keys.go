package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentenv/agentenv/internal/api"
)

// keyFlags are the server roles' key files: named API keys and the
// operator's key.
type keyFlags struct {
	apiKeysFile, operatorKeyFile string
}

func (k *keyFlags) add(cmd *cobra.Command, operatorUse string) {
	f := cmd.Flags()
	f.StringVar(&k.apiKeysFile, "api-keys-file", "", `file of named API keys, one "NAME KEY" a line (# comments): each key sees and controls only its own sandboxes and snapshots; templates are usable by every key and changed only by the key that built them (docs/security.md)`)
	f.StringVar(&k.operatorKeyFile, "operator-key-file", "", "file holding the operator's key: "+operatorUse)
}

// load reads the key files: named keys (key → name) and the operator key.
func (k *keyFlags) load() (named map[string]string, operator string, err error) {
	if k.apiKeysFile != "" {
		if named, err = api.LoadKeys(k.apiKeysFile); err != nil {
			return nil, "", err
		}
	}
	if k.operatorKeyFile != "" {
		b, err := os.ReadFile(k.operatorKeyFile)
		if err != nil {
			return nil, "", fmt.Errorf("--operator-key-file: %w", err)
		}
		if operator = strings.TrimSpace(string(b)); len(operator) < api.MinKeyLen {
			return nil, "", fmt.Errorf("--operator-key-file %s: the key is shorter than %d characters: use a long random one", k.operatorKeyFile, api.MinKeyLen)
		}
	}
	return named, operator, nil
}
