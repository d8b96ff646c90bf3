package netns

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const firewallTable = "agentenv"

// InstallFirewall (re)installs the host rules that fence sandboxes in:
//   - only this server opens connections to its sandboxes: new connections
//     to its range must come from a socket of the server's user (root)
//     with its mark (Mark, MarkSocket), so other host users and processes
//     cannot reach a sandbox's ports directly (they are refused at once);
//   - a sandbox may answer connections the host opened to it (envd, the
//     proxy), but may not open connections to the host itself (its DNS
//     resolver is in its own namespace: dns.go);
//   - sandboxes cannot reach each other or anything else in this server's
//     range, whatever their egress policy says;
//   - what a sandbox may reach beyond the host is its egress policy
//     (SetEgress), jumped to from the forward chain per slot; by default it
//     excludes the host's networks and private ranges (see Blocked); the
//     slots' chains are added later, through netlink (rules.go);
//   - its traffic leaves the host masqueraded;
//   - what a sandbox sends and may not is refused at once (chain refuse),
//     not dropped: what is sent to a sandbox from elsewhere is dropped.
//
// Each server has its own table (by tag); replacing it is atomic, so calling
// it again at every start is safe. The host's own addresses and connected
// subnets are read here, at start: networks added later are not blocked
// until the next start. Egress needs IPv4 forwarding on the host, which
// this turns on.
func (m *Manager) InstallFirewall(ctx context.Context) error {
	if m.loopback {
		return nil
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	host, err := hostNetworks()
	if err != nil {
		return fmt.Errorf("read the host's addresses and routes: %w", err)
	}
	blocked := append(append([]netip.Prefix(nil), defaultBlocked...), host...)
	m.mu.Lock()
	unreachable := append([]netip.Prefix{netip.MustParsePrefix("0.0.0.0/32")}, m.unreachable...)
	m.mu.Unlock()
	ruleset := fmt.Sprintf(`table inet %[1]s {}
delete table inet %[1]s
table inet %[1]s {
	set blocked {
		type ipv4_addr; flags interval; auto-merge;
		elements = %[5]s
	}
	set unreachable {
		type ipv4_addr; flags interval; auto-merge;
		elements = %[7]s
	}
	# The slots whose policy lets them reach the internet (rules.go).
	set internet {
		type ifname;
	}
	# What a sandbox may not send is refused at once (a TCP reset, else
	# ICMP admin-prohibited), so its tools fail in milliseconds instead of
	# waiting for a timeout.
	chain refuse {
		meta l4proto tcp reject with tcp reset
		reject with icmpx type admin-prohibited
	}
	chain input {
		type filter hook input priority -10; policy accept;
		iifname "%[2]s*" ct state established,related accept
		iifname "%[2]s*" goto refuse
	}
	chain output {
		type filter hook output priority -10; policy accept;
		ip daddr %[3]s meta mark %#[4]x meta skuid %[6]d accept
		ip daddr %[3]s ct state established,related accept
		ip daddr %[3]s meta l4proto tcp reject with tcp reset
		ip daddr %[3]s reject with icmpx type admin-prohibited
	}
	chain forward {
		type filter hook forward priority -10; policy accept;
		iifname "%[2]s*" oifname "%[2]s*" goto refuse
		iifname "%[2]s*" ip daddr %[3]s goto refuse
		iifname "%[2]s*" ip daddr @unreachable goto refuse
		oifname "%[2]s*" ct state established,related accept
		oifname "%[2]s*" drop
		iifname "%[2]s*" ct state established,related accept
		iifname "%[2]s*" jump egress
		iifname "%[2]s*" goto refuse
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
`, m.table(), m.ifName, m.CIDR(), m.Mark(), prefixSet(blocked), os.Geteuid(), prefixSet(unreachable))
	m.fw.Lock()
	defer m.fw.Unlock()
	if err := nft(ctx, ruleset); err != nil {
		return err
	}
	m.mu.Lock()
	m.blocked = blocked
	// The slots' chains went with the old table.
	m.rules, m.installed = map[int]*slotRules{}, true
	m.mu.Unlock()
	return nil
}

// SetUnreachable names addresses no sandbox may reach whatever its
// egress policy allows (a fleet's etcd); InstallFirewall applies them.
func (m *Manager) SetUnreachable(p []netip.Prefix) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unreachable = append([]netip.Prefix(nil), p...)
}

func (m *Manager) table() string {
	return firewallTable + m.tag
}

// RemoveFirewall deletes the host rules.
func (m *Manager) RemoveFirewall(ctx context.Context) error {
	if m.loopback {
		return nil
	}
	m.fw.Lock()
	defer m.fw.Unlock()
	err := nft(ctx, fmt.Sprintf("table inet %[1]s {}\ndelete table inet %[1]s\n", m.table()))
	m.mu.Lock()
	m.rules, m.installed = nil, false
	m.mu.Unlock()
	return err
}

// Mark is the socket mark (SO_MARK) of this server's own connections to
// its sandboxes; the firewall refuses new connections to the range without
// it. It is 0xae000000 with the tag's number (base 37, below 2^16) spread
// over bits 0-11 and 20-23: servers with different tags have different
// marks, and the bits kube-proxy (0xc000) and Tailscale (0x40000 and
// 0x80000 under 0xff0000) test stay clear. Setting a mark needs
// CAP_NET_ADMIN (or CAP_NET_RAW since Linux 5.17, which ping may have:
// hence the firewall also wants the socket owned by the server's user).
func (m *Manager) Mark() uint32 {
	n := uint32(0)
	for _, c := range m.tag {
		d := uint32(c-'a') + 1
		if c >= '0' && c <= '9' {
			d = uint32(c-'0') + 27
		}
		n = n*37 + d
	}
	return 0xae000000 | (n>>12)<<20 | n&0xfff
}

// MarkSocket gives a socket the server's mark (Mark). Use it as the
// Control of the net.Dialer of every connection the server opens to a
// sandbox: without it the firewall refuses the connection.
func (m *Manager) MarkSocket(_, _ string, c syscall.RawConn) error {
	if m.loopback {
		return nil
	}
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(m.Mark()))
	})
	if err == nil && serr != nil {
		err = fmt.Errorf("set the socket mark for connections to sandboxes (needs CAP_NET_ADMIN): %w", serr)
	}
	return err
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
