package nodepb_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsCurrent regenerates every protobuf service's code
// (scripts/gen.sh, `make gen`) into a temporary directory and requires
// the committed files to be byte for byte the same: an edited .proto
// must come with its generated code.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Skip("protoc is not installed (apt-get install protobuf-compiler): cannot check the generated code")
	}
	if testing.Short() {
		t.Skip("-short: regenerating may install the protoc plugins")
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "scripts/gen.sh"), out)
	cmd.Env = append(os.Environ(), "PROTOBIN="+filepath.Join(os.TempDir(), "agentenv-protobin"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/gen.sh: %v\n%s", err, b)
	}
	n := 0
	err = filepath.WalkDir(out, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		want, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		got, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Errorf("%s: generated but not committed (%v): run `make gen`", rel, err)
			return nil
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what its .proto generates: run `make gen` and commit", rel)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("scripts/gen.sh generated nothing")
	}
}
