package runscbuild

import (
	"encoding/json"
	"os/exec"
	"testing"
)

// TestHash1MatchesGo checks hash1 against the sum the go command recorded
// for the pinned gVisor module, so the sum the build logs is the one the
// binary's build information carries.
func TestHash1MatchesGo(t *testing.T) {
	out, err := exec.Command("go", "mod", "download", "-json", Module).Output()
	if err != nil {
		t.Fatalf("go mod download: %v", err)
	}
	var d struct{ Dir, Version, Sum string }
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatal(err)
	}
	files, err := moduleFiles(d.Dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := hash1(d.Dir, Module+"@"+d.Version+"/", files)
	if err != nil {
		t.Fatal(err)
	}
	if got != d.Sum {
		t.Errorf("hash1 = %s, want %s (go's sum of %s)", got, d.Sum, d.Dir)
	}
}

func TestEscapePath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"gvisor.dev/gvisor", "gvisor.dev/gvisor"},
		{"github.com/BurntSushi/toml", "github.com/!burnt!sushi/toml"},
	} {
		if got, err := escapePath(tc.in); err != nil || got != tc.want {
			t.Errorf("escapePath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := escapePath("a/../b"); err == nil {
		t.Error(`escapePath("a/../b") succeeded, want an error`)
	}
}
