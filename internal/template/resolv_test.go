package template

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/netns"
)

// Every template names the sandbox's gateway as its resolver (the slot's
// DNS forwarder), whatever its tree had there: the host's resolv.conf
// copied in, a link to a stub resolver, or nothing.
func TestTemplatesResolveThroughTheGateway(t *testing.T) {
	envdBin := filepath.Join(t.TempDir(), "envd")
	if err := os.WriteFile(envdBin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := "nameserver " + netns.GatewayIP.String() + "\n"
	for _, tc := range []struct {
		name  string
		setup func(etc string) error
	}{
		{"none", func(string) error { return nil }},
		{"the host's", func(etc string) error {
			return os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 10.255.255.53\n"), 0o644)
		}},
		{"a link", func(etc string) error {
			return os.Symlink("../run/systemd/resolve/stub-resolv.conf", filepath.Join(etc, "resolv.conf"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rootfs := t.TempDir()
			etc := filepath.Join(rootfs, "etc")
			if err := os.MkdirAll(etc, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := tc.setup(etc); err != nil {
				t.Fatal(err)
			}
			if err := prepareRootfs(rootfs, envdBin); err != nil {
				t.Fatalf("prepareRootfs: %v", err)
			}
			fi, err := os.Lstat(filepath.Join(etc, "resolv.conf"))
			if err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("etc/resolv.conf: %v (%v), want a regular file", fi, err)
			}
			if got, _ := os.ReadFile(filepath.Join(etc, "resolv.conf")); string(got) != want {
				t.Errorf("got resolv.conf %q, want %q", got, want)
			}
		})
	}
}
