package netns

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

const firewallTable = "agentenv"

// InstallFirewall (re)installs the host rules that fence sandboxes in:
// a sandbox may answer connections the host opened to it, but may not open
// connections to the host itself, to other sandboxes, or (until egress
// policy lands) anywhere else. The table is replaced atomically, so calling
// it again at every start is safe.
func (m *Manager) InstallFirewall(ctx context.Context) error {
	ruleset := fmt.Sprintf(`table inet %[1]s {}
delete table inet %[1]s
table inet %[1]s {
	chain input {
		type filter hook input priority -10; policy accept;
		iifname "%[2]s*" ct state established,related accept
		iifname "%[2]s*" drop
	}
	chain forward {
		type filter hook forward priority -10; policy accept;
		iifname "%[2]s*" drop
		oifname "%[2]s*" ct state established,related accept
		oifname "%[2]s*" drop
	}
}
`, firewallTable, linkPrefix)
	return nft(ctx, ruleset)
}

// RemoveFirewall deletes the host rules.
func (m *Manager) RemoveFirewall(ctx context.Context) error {
	return nft(ctx, fmt.Sprintf("table inet %[1]s {}\ndelete table inet %[1]s\n", firewallTable))
}

func nft(ctx context.Context, ruleset string) error {
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft: %w: %s (is the nftables package installed? run make setup)", err, strings.TrimSpace(out.String()))
	}
	return nil
}
