package runscbin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVersionFeatures(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      Features
	}{
		{"upstream", "runsc version release-1\nspec: 1.2.1\n", Features{}},
		{"ours", "runsc version VERSION_MISSING\nspec: 1.2.1\nagentenv: goferless-self-filestore\n", Features{GoferlessFilestore: true}},
		{"unknown feature", "runsc version x\nagentenv: something-else\n", Features{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "runsc")
			script := "#!/bin/sh\nprintf '" + strings.ReplaceAll(tc.out, "\n", `\n`) + "'\n"
			if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			v, f, err := Version(bin)
			if err != nil {
				t.Fatal(err)
			}
			if f != tc.want {
				t.Errorf("features %+v, want %+v", f, tc.want)
			}
			if first := strings.SplitN(tc.out, "\n", 2)[0]; !strings.HasPrefix(v, first+" (sha256 ") {
				t.Errorf("version %q, want %q and the digest", v, first)
			}
		})
	}
}
