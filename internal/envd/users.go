package envd

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
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
	Home string
}

func lookupUser(name string) (account, error) {
	if name == "" {
		name = DefaultUser
	}
	u, err := user.Lookup(name)
	if err != nil {
		return account{}, fmt.Errorf("user %q does not exist in this sandbox", name)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	home := u.HomeDir
	if home == "" {
		home = "/"
	}
	return account{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: home}, nil
}

func (a account) credential() *syscall.Credential {
	return &syscall.Credential{Uid: a.UID, Gid: a.GID, NoSetGroups: true}
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

// resolvePath makes path absolute: relative paths and "~" are taken from
// the user's home, as E2B does. The result is always clean; ".." cannot go
// above "/" (and "/" is the sandbox's own root).
func resolvePath(path string, a account) string {
	switch {
	case path == "" || path == "~":
		return a.Home
	case strings.HasPrefix(path, "~/"):
		path = filepath.Join(a.Home, path[2:])
	case !filepath.IsAbs(path):
		path = filepath.Join(a.Home, path)
	}
	return filepath.Clean(path)
}
