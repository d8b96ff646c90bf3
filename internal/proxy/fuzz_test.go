package proxy_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/proxy"
)

// checkTarget checks what any accepted client input must satisfy.
func checkTarget(t *testing.T, what, id string, port int) {
	t.Helper()
	if port < 1 || port > 65535 {
		t.Fatalf("%s: accepted port %d, want 1..65535", what, port)
	}
	if !proxy.ValidID(id) {
		t.Fatalf("%s: accepted sandbox ID %q", what, id)
	}
}

func FuzzParseHost(f *testing.F) {
	for _, s := range []string{
		"49983-iabc123.example.com", "49983-iabc123.example.com:443", "8080-id-with-dash.example.com",
		"3000-iabc123", "0-iabc123.x", "65536-iabc123.x", "+80-iabc123.x", "080-iabc123.x", "80-.x",
		"80-a:b.example.com", "[::1]:80", "80-a\x00b.x", "99999999999999999999-a.x", "-1-a.x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		id, port, ok := proxy.ParseHost(host)
		if !ok {
			if id != "" || port != 0 {
				t.Fatalf("ParseHost(%q) = %q, %d, false; want zero values with false", host, id, port)
			}
			return
		}
		checkTarget(t, "ParseHost("+strconv.Quote(host)+")", id, port)
		// Only the canonical form is accepted: the first label is exactly
		// "<port>-<id>".
		if want := strconv.Itoa(port) + "-" + id; !strings.HasPrefix(host, want) {
			t.Fatalf("ParseHost(%q) = %q, %d; the host does not start with %q", host, id, port, want)
		}
	})
}

// Valid "<port>-<id>.<domain>[:port]" forms round-trip.
func FuzzParseHostRoundTrip(f *testing.F) {
	f.Add(uint16(49983), "iabc123", "example.com", "")
	f.Add(uint16(1), "a-b_c", "localhost", "3001")
	f.Add(uint16(65535), "X", "", "443")
	f.Fuzz(func(t *testing.T, port uint16, id, domain, hostPort string) {
		if port == 0 || !proxy.ValidID(id) || strings.Trim(hostPort, "0123456789") != "" {
			return // not a valid form
		}
		host := strconv.Itoa(int(port)) + "-" + id
		if domain != "" {
			host += "." + domain
		}
		if hostPort != "" {
			host += ":" + hostPort
		}
		gotID, gotPort, ok := proxy.ParseHost(host)
		if !ok || gotID != id || gotPort != int(port) {
			t.Fatalf("ParseHost(%q) = %q, %d, %v; want %q, %d, true", host, gotID, gotPort, ok, id, port)
		}
	})
}

// The E2b-Sandbox-Id/E2b-Sandbox-Port headers: never a panic, only valid
// targets accepted, headers win over Host.
func FuzzTarget(f *testing.F) {
	f.Add("iabc123", "49983", "8080-other.example.com")
	f.Add("", "", "49983-iabc123.example.com")
	f.Add("iabc123", "0", "")
	f.Add("iabc123", "65536", "")
	f.Add("iabc123", "+80", "")
	f.Add("iabc123", " 80", "")
	f.Add("a b", "80", "")
	f.Add("iabc123", "", "")
	f.Fuzz(func(t *testing.T, idHdr, portHdr, host string) {
		h := http.Header{}
		if idHdr != "" {
			h.Set("E2b-Sandbox-Id", idHdr)
		}
		if portHdr != "" {
			h.Set("E2b-Sandbox-Port", portHdr)
		}
		id, port, err := proxy.Target(h, host)
		if err != nil {
			if id != "" || port != 0 {
				t.Fatalf("Target = %q, %d, %v; want zero values with an error", id, port, err)
			}
			if err.Error() == "" {
				t.Fatal("Target error has no message")
			}
			return
		}
		checkTarget(t, "Target", id, port)
		if idHdr != "" {
			if id != idHdr || strconv.Itoa(port) != portHdr {
				t.Fatalf("Target with headers %q/%q = %q, %d; want the headers' values", idHdr, portHdr, id, port)
			}
			return
		}
		if hid, hport, ok := proxy.ParseHost(host); !ok || hid != id || hport != port {
			t.Fatalf("Target by Host %q = %q, %d; ParseHost says %q, %d, %v", host, id, port, hid, hport, ok)
		}
	})
}
