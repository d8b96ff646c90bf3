package envd

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"connectrpc.com/connect"
)

// DefaultUser is the user commands and file operations run as when the
// client names none, as in E2B.
const DefaultUser = "user"

// account is a resolved user inside the sandbox.
type account struct {
	Name string
	UID  uint32
	GID  uint32
	// Groups are the supplementary groups (from /etc/group), the user's
	// own gid included.
	Groups []uint32
	// Home is absolute and clean.
	Home string
}

// defaults are the template's default user and working directory.
var defaults atomic.Pointer[[2]string]

func setDefaults(user, workdir string) {
	if user == "" {
		user = DefaultUser
	}
	defaults.Store(&[2]string{user, workdir})
}

func defaultUser() string {
	if d := defaults.Load(); d != nil {
		return d[0]
	}
	return DefaultUser
}

// defaultWorkdir is the template's working directory ("" for none).
func defaultWorkdir() string {
	if d := defaults.Load(); d != nil {
		return d[1]
	}
	return ""
}

func lookupUser(name string) (account, error) {
	if name == "" {
		name = defaultUser()
	}
	u, err := user.Lookup(name)
	if err != nil {
		return account{}, fmt.Errorf("user %q does not exist in this sandbox", name)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	a := account{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: cleanHome(u.HomeDir)}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				a.Groups = append(a.Groups, uint32(g))
			}
		}
	}
	return a, nil
}

// cleanHome makes a home directory from /etc/passwd usable as the base of
// relative paths: absolute, clean, "/" if missing or relative.
func cleanHome(home string) string {
	if !filepath.IsAbs(home) || strings.IndexByte(home, 0) >= 0 {
		return "/"
	}
	return filepath.Clean(home)
}

// credential is the user's for a command: no group of envd's is kept.
func (a account) credential() *syscall.Credential {
	return &syscall.Credential{Uid: a.UID, Gid: a.GID, Groups: a.Groups}
}

// userFromHeader reads the user name the E2B SDK sends as HTTP basic auth
// ("Authorization: Basic base64(user:)").
func userFromHeader(h http.Header) string {
	auth := h.Get("Authorization")
	if !strings.HasPrefix(auth, "Basic ") {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(auth, "Basic "))
	if err != nil {
		return ""
	}
	name, _, _ := strings.Cut(string(b), ":")
	return name
}

// connectUser resolves the user of a Connect request.
func connectUser(h http.Header) (account, error) {
	a, err := lookupUser(userFromHeader(h))
	if err != nil {
		return account{}, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return a, nil
}

// errNUL is returned for a path no system call could take.
var errNUL = errors.New("path contains a NUL byte")

// resolvePath makes path absolute: relative paths and "~" are taken from
// the user's home, as E2B does. The result is always clean; ".." cannot go
// above "/" (and "/" is the sandbox's own root). It says nothing about
// access: file operations run as envd (root), as E2B's do; the user inside
// a sandbox is not a boundary, the sandbox is.
func resolvePath(path string, a account) (string, error) {
	if strings.IndexByte(path, 0) >= 0 {
		return "", fmt.Errorf("%w: %q", errNUL, path)
	}
	home := cleanHome(a.Home)
	switch {
	case path == "" || path == "~":
		return home, nil
	case strings.HasPrefix(path, "~/"):
		path = filepath.Join(home, path[2:])
	case !filepath.IsAbs(path):
		path = filepath.Join(home, path)
	}
	return filepath.Clean(path), nil
}
