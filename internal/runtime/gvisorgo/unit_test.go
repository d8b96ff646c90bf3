package gvisorgo

// Tests here need neither root nor gVisor.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentenv/internal/testenv"
)

// TestPinnedVersion keeps gvisorVersion (checked against the runsc binary at
// run time) equal to the gVisor version in go.mod.
func TestPinnedVersion(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == gvisorModule {
			if got, want := gvisorVersion, f[1]; got != want {
				t.Errorf("gvisorgo pins gVisor %s, go.mod requires %s: change both together", got, want)
			}
			return
		}
	}
	t.Errorf("go.mod does not require %s", gvisorModule)
}

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"rtt00000112345678901", true},
		{"a.b+c-D9", true},
		{"", false},
		{".", false},
		{"..", false},
		{"../x", false},
		{"a/b", false},
		{"a_b", false},
		{"a:b", false},
		{"a b", false},
	} {
		if got := validID(tc.id) == nil; got != tc.want {
			t.Errorf("validID(%q) ok = %v, want %v", tc.id, got, tc.want)
		}
	}
}
