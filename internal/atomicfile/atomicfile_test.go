package atomicfile

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The child process of TestKilledWriter: it writes newContent to the file
// named by $ATOMICFILE_CHILD_PATH, printing "step NAME" at each step and
// waiting for a line on stdin before going on, so the parent can kill it
// there.
func TestWriterChild(t *testing.T) {
	path := os.Getenv("ATOMICFILE_CHILD_PATH")
	if path == "" {
		t.Skip("run by TestKilledWriter as its child")
	}
	in := bufio.NewReader(os.Stdin)
	pause := func(name string) {
		fmt.Printf("step %s\n", name)
		if _, err := in.ReadString('\n'); err != nil {
			os.Exit(3)
		}
	}
	half := len(newContent) / 2
	if os.Getenv("ATOMICFILE_CHILD_MODE") == "in-place" {
		// What a hand-written persist without the helper does.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		pause("created")
		f.Write(newContent[:half])
		pause("half")
		f.Write(newContent[half:])
		pause("written")
		f.Close()
		return
	}
	step = pause
	err := Write(path, 0o600, func(w io.Writer) error {
		w.Write(newContent[:half])
		pause("half")
		_, err := w.Write(newContent[half:])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	pause("done")
}

var (
	oldContent = bytes.Repeat([]byte("old record\n"), 1000)
	newContent = bytes.Repeat([]byte("the new record\n"), 20000) // larger than the write buffer
)

// runChild runs the writer child on path and kills it at step stop ("" to
// let it finish). It returns the steps the child reached.
func runChild(t *testing.T, path, mode, stop string) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWriterChild$")
	cmd.Env = append(os.Environ(), "ATOMICFILE_CHILD_PATH="+path, "ATOMICFILE_CHILD_MODE="+mode)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var seen []string
	sc := bufio.NewScanner(stdout)
	killed := false
	for sc.Scan() {
		name, ok := strings.CutPrefix(sc.Text(), "step ")
		if !ok {
			continue
		}
		seen = append(seen, name)
		if name == stop {
			cmd.Process.Kill()
			killed = true
			break
		}
		io.WriteString(stdin, "\n")
	}
	stdin.Close()
	err = cmd.Wait()
	if !killed && err != nil {
		t.Fatalf("writer child: %v", err)
	}
	if killed && err == nil {
		t.Fatalf("writer child killed at %q exited cleanly", stop)
	}
	return seen
}

// TestKilledWriter kills a writer between each step of Write and checks
// that the file then holds the old record or the new one, never an empty
// or partial file; and that a writer without the helper, killed the same
// way, leaves a torn file (so the check can see one).
func TestKilledWriter(t *testing.T) {
	steps := []struct {
		stop string
		want []byte // nil: old or new
	}{
		{"created", oldContent},
		{"half", oldContent},
		{"written", oldContent},
		{"synced", oldContent},
		{"renamed", newContent},
		{"done", newContent},
		{"", newContent},
	}
	for _, s := range steps {
		name := "kill at " + s.stop
		if s.stop == "" {
			name = "no kill"
		}
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sandbox.json")
			if err := WriteFile(path, oldContent, 0o600); err != nil {
				t.Fatal(err)
			}
			seen := runChild(t, path, "atomic", s.stop)
			if s.stop != "" && seen[len(seen)-1] != s.stop {
				t.Fatalf("child reached steps %v, never %q", seen, s.stop)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, s.want) {
				t.Fatalf("after a kill at %q: got %d bytes (%.20q...), want the %s record (%d bytes)",
					s.stop, len(got), got, map[bool]string{true: "old", false: "new"}[bytes.Equal(s.want, oldContent)], len(s.want))
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Fatalf("mode: got %v, want 0600", st.Mode().Perm())
			}
		})
	}
	t.Run("without the helper", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "sandbox.json")
		if err := os.WriteFile(path, oldContent, 0o600); err != nil {
			t.Fatal(err)
		}
		runChild(t, path, "in-place", "half")
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(got, oldContent) || bytes.Equal(got, newContent) {
			t.Fatalf("an in-place writer killed half-way left a whole record (%d bytes): the check cannot tell a torn file", len(got))
		}
	})
}

// TestWriteFailure checks that a fill that fails leaves the old file and
// no temporary file behind.
func TestWriteFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rec.json")
	if err := WriteFile(path, oldContent, 0o644); err != nil {
		t.Fatal(err)
	}
	err := Write(path, 0o644, func(w io.Writer) error {
		w.Write([]byte("partial"))
		return io.ErrUnexpectedEOF
	})
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("got error %v, want %v", err, io.ErrUnexpectedEOF)
	}
	got, _ := os.ReadFile(path)
	if !bytes.Equal(got, oldContent) {
		t.Fatalf("got %d bytes, want the old %d", len(got), len(oldContent))
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("got %d entries in the directory, want 1 (no temporary file left)", len(ents))
	}
}

// TestRename checks that Rename moves a written file into place with its
// content.
func TestRename(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "image.tmp"), filepath.Join(dir, "image")
	os.WriteFile(src, newContent, 0o644)
	os.WriteFile(dst, oldContent, 0o644)
	if err := Rename(src, dst); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(dst)
	if !bytes.Equal(got, newContent) {
		t.Fatalf("got %d bytes, want %d", len(got), len(newContent))
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Fatalf("source after Rename: got %v, want not exist", err)
	}
}
