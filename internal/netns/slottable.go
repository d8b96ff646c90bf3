package netns

import (
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// addSlotTable installs the namespace's own table through netlink, in one
// batch, from the calling thread's network namespace (the new slot's):
//
//	table ip slot {
//		chain raw {
//			type filter hook prerouting priority raw; policy accept;
//			# eth0 belongs to the sandbox's own stack; the kernel must ignore it.
//			iifname "eth0" drop
//		}
//		chain forward {
//			type filter hook forward priority filter; policy drop;
//			iifname "gw0" oifname "up0" ip saddr 169.254.0.21 accept
//			iifname "up0" oifname "gw0" ct state established,related accept
//			iifname "up0" oifname "gw0" ip daddr 169.254.0.21 ct status dnat accept
//		}
//		chain input {
//			type filter hook input priority filter; policy drop;
//			iifname "lo" accept
//			ct state established,related accept
//			# the slot's DNS forwarder (dns.go)
//			iifname "gw0" ip daddr 169.254.0.22 udp dport 53 accept
//			iifname "gw0" ip daddr 169.254.0.22 tcp dport 53 accept
//			iifname "gw0" meta l4proto tcp reject with tcp reset
//			iifname "gw0" reject with icmp type admin-prohibited
//		}
//		chain prerouting {
//			type nat hook prerouting priority dstnat; policy accept;
//			iifname "up0" ip daddr <slot address> dnat to 169.254.0.21
//		}
//		chain postrouting {
//			type nat hook postrouting priority srcnat; policy accept;
//			oifname "up0" ip saddr 169.254.0.21 snat to <slot address>
//		}
//	}
//
// Forwarding only between the sandbox and the uplink (with the sandbox's
// own address: anti-spoofing), nothing for the namespace's kernel but the
// DNS forwarder's port on the gateway address (anything else the sandbox
// sends to the gateway is refused at once), and the NAT between the fixed
// internal address and the slot's address.
func addSlotTable(slot Slot) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Name: "slot", Family: nftables.TableFamilyIPv4})
	accept, drop := nftables.ChainPolicyAccept, nftables.ChainPolicyDrop
	chain := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority, policy *nftables.ChainPolicy, rules ...[]expr.Any) {
		ch := c.AddChain(&nftables.Chain{Table: t, Name: name, Type: typ, Hooknum: hook, Priority: prio, Policy: policy})
		for _, r := range rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
		}
	}
	internal, sandbox := []byte(InternalIP.To4()), []byte(slot.SandboxIP.To4())
	chain("raw", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRaw, &accept,
		rule(iif(SandboxIf), verdict(expr.VerdictDrop)))
	chain("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter, &drop,
		rule(iif(gatewayIf), oif(uplinkIf), ipField(12, internal), verdict(expr.VerdictAccept)),
		rule(iif(uplinkIf), oif(gatewayIf), ctAny(expr.CtKeySTATE, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept)),
		rule(iif(uplinkIf), oif(gatewayIf), ipField(16, internal), ctAny(expr.CtKeySTATUS, ipsDstNAT), verdict(expr.VerdictAccept)))
	gateway := []byte(GatewayIP.To4())
	chain("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter, &drop,
		rule(iif("lo"), verdict(expr.VerdictAccept)),
		rule(ctAny(expr.CtKeySTATE, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept)),
		rule(iif(gatewayIf), ipField(16, gateway), dport(unix.IPPROTO_UDP, dnsPort), verdict(expr.VerdictAccept)),
		rule(iif(gatewayIf), ipField(16, gateway), dport(unix.IPPROTO_TCP, dnsPort), verdict(expr.VerdictAccept)),
		rule(iif(gatewayIf), l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}),
		rule(iif(gatewayIf), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: icmpAdminProhibited}}))
	chain("prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest, &accept,
		rule(iif(uplinkIf), ipField(16, sandbox), nat(expr.NATTypeDestNAT, internal)))
	chain("postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource, &accept,
		rule(oif(uplinkIf), ipField(12, internal), nat(expr.NATTypeSourceNAT, sandbox)))
	return c.Flush()
}

// icmpAdminProhibited is ICMP's "communication administratively
// prohibited" code of destination unreachable.
const icmpAdminProhibited = 13

func l4proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// dport matches a UDP or TCP destination port.
func dport(proto byte, port uint16) []expr.Any {
	return append(l4proto(proto),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)})
}

// ipsDstNAT is the conntrack status bit of a destination-NATed connection
// (IPS_DST_NAT, "ct status dnat").
const ipsDstNAT = 1 << 5

func rule(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func ifMatch(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

func iif(name string) []expr.Any { return ifMatch(expr.MetaKeyIIFNAME, name) }
func oif(name string) []expr.Any { return ifMatch(expr.MetaKeyOIFNAME, name) }

// ipField matches an IPv4 header field: offset 12 is the source address,
// 16 the destination.
func ipField(offset uint32, value []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(len(value))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: value},
	}
}

// ctAny matches a connection whose state or status has any of bits.
func ctAny(key expr.CtKey, bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: key, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func nat(typ expr.NATType, to []byte) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: to},
		&expr.NAT{Type: typ, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
}
