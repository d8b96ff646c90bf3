package template_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// EnsureUser adds a user as useradd --create-home would: the first free
// uid from 1000, its own group (another gid when the same is taken), a
// home it owns; an existing user is found by name or uid.
func TestEnsureUser(t *testing.T) {
	testenv.NeedRoot(t) // chown of the new home
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "etc/group"), []byte("root:x:0:\nnode:x:1000:\nstaff:x:1001:\n"), 0o644)
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	u, err := template.EnsureUser(root, "user")
	if err != nil {
		t.Fatal(err)
	}
	if u.UID != 1001 || u.GID != 1002 || u.Home != "/home/user" || u.Shell != "/bin/sh" {
		t.Errorf("got %+v, want uid 1001, gid 1002, home /home/user, shell /bin/sh", u)
	}
	st, err := os.Stat(filepath.Join(dir, "home/user"))
	if err != nil || st.Sys().(*syscall.Stat_t).Uid != 1001 {
		t.Errorf("home: %v, want it owned by 1001", err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "etc/group"))
	if !strings.Contains(string(b), "user:x:1002:") {
		t.Errorf("/etc/group = %q", b)
	}
	again, err := template.EnsureUser(root, "user")
	if err != nil || again != u {
		t.Errorf("second EnsureUser: %+v, %v; want %+v", again, err, u)
	}
	if got, ok, _ := template.LookupUser(root, "1000"); !ok || got.Name != "node" {
		t.Errorf("LookupUser(1000) = %+v, %v", got, ok)
	}
	for _, bad := range []string{"", "a:b", "../x", "4242"} {
		if _, err := template.EnsureUser(root, bad); err == nil {
			t.Errorf("EnsureUser(%q) worked", bad)
		}
	}
	// A home that is a link out of the tree is not followed.
	os.Symlink("/etc", filepath.Join(dir, "home/evil"))
	if _, err := template.EnsureUser(root, "evil"); err == nil {
		t.Error("EnsureUser followed home/evil -> /etc")
	}
}
