package template

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"os"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// User is one entry of a tree's /etc/passwd.
type User struct {
	Name     string
	UID, GID int
	Home     string
	Shell    string
}

// LookupUser finds a user by name or uid in the /etc/passwd of the tree
// under root; ok is false when there is none.
func LookupUser(root *os.Root, nameOrUID string) (u User, ok bool, err error) {
	b, err := root.ReadFile("etc/passwd")
	if errors.Is(err, fs.ErrNotExist) {
		return User{}, false, nil
	}
	if err != nil {
		return User{}, false, fmt.Errorf("read /etc/passwd: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 7 || (f[0] != nameOrUID && f[2] != nameOrUID) {
			continue
		}
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			continue
		}
		return User{Name: f[0], UID: uid, GID: gid, Home: f[5], Shell: f[6]}, true, nil
	}
	return User{}, false, nil
}

// EnsureRootUser makes root (uid 0, home /root) exist in the tree's
// /etc/passwd and /etc/group, as every template has it.
func EnsureRootUser(root *os.Root) error {
	if err := root.MkdirAll("etc", 0o755); err != nil {
		return err
	}
	for _, l := range []struct{ file, prefix, line string }{
		{"etc/passwd", "root:", "root:x:0:0:root:/root:/bin/sh"},
		{"etc/group", "root:", "root:x:0:"},
	} {
		if err := ensureLine(root, l.file, l.prefix, l.line); err != nil {
			return err
		}
	}
	return nil
}

// EnsureUser makes user name exist in the tree under root, as `useradd
// --create-home --shell /bin/bash` would: the first free uid from 1000 (a
// group of the same name and id when that id is free), a home under /home
// owned by it. An existing user is returned as it is. Every path is
// resolved inside root.
func EnsureUser(root *os.Root, name string) (User, error) {
	if !userRE.MatchString(name) || strings.Contains(name, ":") {
		return User{}, errdefs.Invalid("user %q: give a user name of letters, digits, '_', '.' or '-'", name)
	}
	if u, ok, err := LookupUser(root, name); err != nil || ok {
		return u, err
	}
	if _, err := strconv.Atoi(name); err == nil {
		return User{}, errdefs.Invalid("user %q is a uid missing from the image's /etc/passwd: give a user name to create", name)
	}
	uid, err := freeID(root, "etc/passwd", 2)
	if err != nil {
		return User{}, err
	}
	gid := uid
	if taken, err := idTaken(root, "etc/group", 2, gid); err != nil {
		return User{}, err
	} else if taken {
		if gid, err = freeID(root, "etc/group", 2); err != nil {
			return User{}, err
		}
	}
	shell := "/bin/sh"
	if _, err := root.Stat("bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	u := User{Name: name, UID: uid, GID: gid, Home: path.Join("/home", name), Shell: shell}
	if err := root.MkdirAll("etc", 0o755); err != nil {
		return User{}, err
	}
	if err := ensureLine(root, "etc/group", name+":", fmt.Sprintf("%s:x:%d:", name, gid)); err != nil {
		return User{}, err
	}
	if err := ensureLine(root, "etc/passwd", name+":", fmt.Sprintf("%s:x:%d:%d::%s:%s", name, uid, gid, u.Home, shell)); err != nil {
		return User{}, err
	}
	home := strings.TrimPrefix(u.Home, "/")
	if err := root.MkdirAll(home, 0o755); err != nil {
		return User{}, err
	}
	return u, root.Lchown(home, uid, gid)
}

// freeID is the first id from 1000 that no line of file uses in field.
func freeID(root *os.Root, file string, field int) (int, error) {
	for id := 1000; id < 60000; id++ {
		taken, err := idTaken(root, file, field, id)
		if err != nil {
			return 0, err
		}
		if !taken {
			return id, nil
		}
	}
	return 0, errdefs.Invalid("/%s: no free id from 1000 to 59999", file)
}

func idTaken(root *os.Root, file string, field, id int) (bool, error) {
	b, err := root.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	want := strconv.Itoa(id)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ":"); len(f) > field && f[field] == want {
			return true, nil
		}
	}
	return false, nil
}
