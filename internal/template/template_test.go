package template_test

import (
	"errors"
	"strings"
	"testing"

	"agentenv/internal/errdefs"
	"agentenv/internal/template"
)

func TestValidName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"busybox", true},
		{"a", true},
		{"0day", true},
		{"my.tpl_v2-x", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{"", false},
		{"Busybox", false},
		{"-x", false},
		{".hidden", false},
		{"_x", false},
		{"a/b", false},
		{"../etc", false},
		{"a b", false},
		{"a\n", false},
		{"ünicode", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := template.ValidName(tt.name)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("ValidName(%q) = %v, want an ErrInvalid", tt.name, err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		req  template.BuildRequest
		ok   bool
	}{
		{"busybox", template.BuildRequest{Name: "bb", Busybox: true}, true},
		{"debian", template.BuildRequest{Name: "deb", Debian: "bookworm"}, true},
		{"debian with packages", template.BuildRequest{Name: "deb", Debian: "bookworm", Packages: []string{"python3", "libc6-dev", "g++"}}, true},
		{"rootfs directory", template.BuildRequest{Name: "r", Rootfs: dir}, true},
		{"bad name", template.BuildRequest{Name: "Bad", Busybox: true}, false},
		{"no source", template.BuildRequest{Name: "x"}, false},
		{"two sources", template.BuildRequest{Name: "x", Busybox: true, Debian: "bookworm"}, false},
		{"bad suite", template.BuildRequest{Name: "x", Debian: "Bookworm"}, false},
		{"suite with slash", template.BuildRequest{Name: "x", Debian: "../bookworm"}, false},
		{"bad package", template.BuildRequest{Name: "x", Debian: "bookworm", Packages: []string{"vim;rm -rf /"}}, false},
		{"option as package", template.BuildRequest{Name: "x", Debian: "bookworm", Packages: []string{"--foo"}}, false},
		{"packages without debian", template.BuildRequest{Name: "x", Busybox: true, Packages: []string{"vim"}}, false},
		{"relative rootfs", template.BuildRequest{Name: "x", Rootfs: "some/dir"}, false},
		{"missing rootfs", template.BuildRequest{Name: "x", Rootfs: dir + "/missing.tar"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := template.Validate(tt.req)
			if (err == nil) != tt.ok {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", tt.req, err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Validate(%+v) = %v, want an ErrInvalid", tt.req, err)
			}
		})
	}
}
