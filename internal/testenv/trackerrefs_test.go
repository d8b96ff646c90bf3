package testenv_test

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// trackerRef matches a citation of a tracker the repository does not
// contain: "issue", "finding" or "session" followed by a number.
var trackerRef = regexp.MustCompile(`(?i)\b(issue|finding|session)s? #?[0-9]+`)

// TestNoTrackerNumbers checks that code, tests and docs say what a check
// guards in words, not by the number of an issue, finding or session a
// reader cannot look up.
func TestNoTrackerNumbers(t *testing.T) {
	root := testenv.RepoRoot()
	exts := map[string]bool{".go": true, ".md": true, ".yaml": true, ".py": true, ".mjs": true, ".sh": true}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !exts[filepath.Ext(p)] {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		rel, _ := filepath.Rel(root, p)
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for n := 1; sc.Scan(); n++ {
			if m := trackerRef.FindString(sc.Text()); m != "" {
				t.Errorf("%s:%d cites %q: say in words what it guards or where it comes from", rel, n, m)
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}
