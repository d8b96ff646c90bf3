package netns

import (
	"agentenv/internal/childproc"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
)

const firewallTable = "agentenv"

// InstallFirewall (re)installs the host rules that fence sandboxes in:
//   - a sandbox may answer connections the host opened to it (envd, the
//     proxy), but may not open connections to the host itself;
//   - sandboxes cannot reach each other;
//   - what a sandbox may reach beyond the host is its egress policy
//     (SetEgress), jumped to from the forward chain per slot;
//   - its traffic leaves the host masqueraded.
//
// Each server has its own table (by tag); replacing it is atomic, so calling
// it again at every start is safe. Egress needs IPv4 forwarding on the host,
// which this turns on.
func (m *Manager) InstallFirewall(ctx context.Context) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
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
		oifname "%[2]s*" ct state established,related accept
		oifname "%[2]s*" iifname != "%[2]s*" drop
		iifname "%[2]s*" ct state established,related accept
		iifname "%[2]s*" jump egress
		iifname "%[2]s*" drop
	}
	map slots {
		type ifname : verdict
	}
	chain egress {
		iifname vmap @slots
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr %[3]s oifname != "%[2]s*" masquerade
	}
}
`, m.table(), m.ifName, m.CIDR())
	return nft(ctx, ruleset)
}

func (m *Manager) table() string {
	return firewallTable + m.tag
}

// RemoveFirewall deletes the host rules.
func (m *Manager) RemoveFirewall(ctx context.Context) error {
	return nft(ctx, fmt.Sprintf("table inet %[1]s {}\ndelete table inet %[1]s\n", m.table()))
}

// Egress is what a sandbox may reach beyond the host. Allow wins over Deny,
// Deny over Internet: with Internet off, only Allow is reachable; with it
// on, everything but Deny. Other sandboxes are reachable only if listed in
// Allow (by their host-side address); the host itself never is.
type Egress struct {
	Internet bool
	Allow    []netip.Prefix
	Deny     []netip.Prefix
}

// ParsePrefixes reads CIDRs or plain IPv4 addresses.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("%q is not an IPv4 address or CIDR", s)
		}
		out = append(out, netip.PrefixFrom(a, 32))
	}
	return out, nil
}

func prefixSet(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return "{ " + strings.Join(s, ", ") + " }"
}

// SetEgress installs (or replaces) the egress policy of a slot. The slot's
// own chain also drops anything not sent from the slot's address, so a
// sandbox cannot pass for another.
func (m *Manager) SetEgress(ctx context.Context, slot Slot, e Egress) error {
	chain := "slot" + fmt.Sprint(slot.Index)
	var b strings.Builder
	fmt.Fprintf(&b, "add chain inet %s %s\nflush chain inet %s %s\n", m.table(), chain, m.table(), chain)
	rule := func(format string, args ...any) {
		fmt.Fprintf(&b, "add rule inet %s %s %s\n", m.table(), chain, fmt.Sprintf(format, args...))
	}
	rule("ip saddr != %s drop", slot.SandboxIP)
	if len(e.Allow) > 0 {
		rule("ip daddr %s accept", prefixSet(e.Allow))
	}
	rule("oifname \"%s*\" drop", m.ifName)
	if len(e.Deny) > 0 {
		rule("ip daddr %s drop", prefixSet(e.Deny))
	}
	if e.Internet {
		rule("accept")
	} else {
		rule("drop")
	}
	// Jumped to through the slots map: one nft call per create, no lookup.
	fmt.Fprintf(&b, "add element inet %s slots { \"%s\" : jump %s }\n", m.table(), slot.HostIf, chain)
	return nft(ctx, b.String())
}

// ClearEgress removes a slot's policy (when its sandbox is gone). It is
// idempotent: without the map element (a half-made slot), only the chain
// is removed, if there is one.
func (m *Manager) ClearEgress(ctx context.Context, slot Slot) error {
	chain := "slot" + fmt.Sprint(slot.Index)
	t := m.table()
	dropChain := fmt.Sprintf("add chain inet %[1]s %[2]s\ndelete chain inet %[1]s %[2]s\n", t, chain)
	err := nft(ctx, fmt.Sprintf("delete element inet %s slots { \"%s\" }\n", t, slot.HostIf)+dropChain)
	if err != nil {
		return nft(ctx, dropChain)
	}
	return nil
}

func nft(ctx context.Context, ruleset string) error {
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := childproc.Run(cmd); err != nil {
		return fmt.Errorf("nft: %w: %s (is the nftables package installed? run make setup)", err, strings.TrimSpace(out.String()))
	}
	return nil
}
