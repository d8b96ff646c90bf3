package netns

import (
	"net/netip"
	"strings"
	"testing"
)

// Prefixes become the disjoint ranges the kernel accepts in an interval
// set, encoded as nft encodes them.
func TestIntervalElements(t *testing.T) {
	tests := []struct {
		in   []string
		want string // elements in order; an end element starts with "/"
	}{
		{nil, ""},
		{[]string{"10.1.2.0/24"}, "/0.0.0.0 10.1.2.0 /10.1.3.0"},
		{[]string{"10.1.3.0/24", "10.1.2.0/24"}, "/0.0.0.0 10.1.2.0 /10.1.4.0"},               // adjacent: merged
		{[]string{"10.0.0.0/8", "10.1.2.3/32", "10.9.0.0/16"}, "/0.0.0.0 10.0.0.0 /11.0.0.0"}, // inside: merged
		{[]string{"8.8.8.8/32", "1.1.1.1/32"}, "/0.0.0.0 1.1.1.1 /1.1.1.2 8.8.8.8 /8.8.8.9"},  // sorted
		{[]string{"224.0.0.0/3"}, "/0.0.0.0 224.0.0.0"},                                       // to the last address: no end
		{[]string{"0.0.0.0/0", "10.0.0.0/8"}, "0.0.0.0"},                                      // everything
		{[]string{"0.0.0.0/8", "255.255.255.255/32"}, "0.0.0.0 /1.0.0.0 255.255.255.255"},     // from 0: no leading end
		{[]string{"10.1.2.7/24"}, "/0.0.0.0 10.1.2.0 /10.1.3.0"},                              // host bits ignored
		{[]string{"192.168.0.0/16", "192.168.255.255/32", "192.169.0.0/16"}, "/0.0.0.0 192.168.0.0 /192.170.0.0"},
	}
	for _, tt := range tests {
		var ps []netip.Prefix
		for _, s := range tt.in {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		var got []string
		for _, e := range intervalElements(ranges(ps)) {
			a := netip.AddrFrom4([4]byte(e.Key)).String()
			if e.IntervalEnd {
				a = "/" + a
			}
			got = append(got, a)
		}
		if g := strings.Join(got, " "); g != tt.want {
			t.Errorf("%v: got %q, want %q", tt.in, g, tt.want)
		}
	}
}
