package envd

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestResolvePath(t *testing.T) {
	home := account{Name: "user", Home: "/home/user"}
	tests := []struct {
		path string
		a    account
		want string
	}{
		{"", home, "/home/user"},
		{"~", home, "/home/user"},
		{"~/a/../b", home, "/home/user/b"},
		{"a/b/", home, "/home/user/a/b"},
		{"~x", home, "/home/user/~x"},
		{"../../../etc/passwd", home, "/etc/passwd"},
		{"/etc//passwd/.", home, "/etc/passwd"},
		{"/..", home, "/"},
		{"a", account{Home: "relative/home"}, "/a"},
		{"a", account{Home: ""}, "/a"},
		{"", account{Home: "/srv/../x/"}, "/x"},
	}
	for _, tt := range tests {
		got, err := resolvePath(tt.path, tt.a)
		if err != nil || got != tt.want {
			t.Errorf("resolvePath(%q, home %q): got %q, %v, want %q", tt.path, tt.a.Home, got, err, tt.want)
		}
	}
	if got, err := resolvePath("/etc/passwd\x00.txt", home); err == nil {
		t.Errorf("resolvePath with a NUL: got %q, want an error", got)
	}
}

// FuzzResolvePath checks that any client path and any home from /etc/passwd
// give a clean absolute path without NUL, or an error for a NUL.
func FuzzResolvePath(f *testing.F) {
	for _, s := range [][2]string{
		{"", "/home/user"}, {"~", "/"}, {"~/../..", "/home/user"}, {"a\x00b", "/home/user"},
		{"../x", "rel"}, {"/a/./b//", ""}, {"~user/x", "/root"}, {"x", "/home/\x00"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, path, home string) {
		got, err := resolvePath(path, account{Name: "user", Home: home})
		if strings.IndexByte(path, 0) >= 0 {
			if err == nil {
				t.Fatalf("resolvePath(%q, %q) = %q, want an error for the NUL", path, home, got)
			}
			return
		}
		if err != nil {
			t.Fatalf("resolvePath(%q, %q): %v", path, home, err)
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("resolvePath(%q, %q) = %q, want a clean absolute path without NUL", path, home, got)
		}
		if filepath.IsAbs(path) && got != filepath.Clean(path) {
			t.Fatalf("resolvePath(%q, %q) = %q, want the absolute path cleaned: %q", path, home, got, filepath.Clean(path))
		}
	})
}
