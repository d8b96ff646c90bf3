package envd

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/testenv"
)

func nobody(t *testing.T) account {
	t.Helper()
	testenv.NeedRoot(t)
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skip("skipping: no user nobody on this host to act as")
	}
	a, err := lookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// threadCreds lists the uid and groups lines of every thread of this
// process that differ from want.
func threadCreds(t *testing.T, want string) []string {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		if got := credLines(string(b)); got != want {
			bad = append(bad, p+": "+got)
		}
	}
	return bad
}

func credLines(status string) string {
	var out []string
	for _, l := range strings.Split(status, "\n") {
		if strings.HasPrefix(l, "Uid:") || strings.HasPrefix(l, "Gid:") || strings.HasPrefix(l, "Groups:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, "; ")
}

func TestAsUserSwitchesOneThreadAndBack(t *testing.T) {
	a := nobody(t)
	a.Groups = []uint32{a.GID, 4242}
	b, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		t.Fatal(err)
	}
	root := credLines(string(b))
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := asUser(a, func() error {
				r, e, s := unix.Getresuid()
				if r != int(a.UID) || e != int(a.UID) || s != 0 {
					errs <- fmt.Sprintf("got uids %d %d %d, want %d %d 0", r, e, s, a.UID, a.UID)
				}
				gs, _ := unix.Getgroups()
				slices.Sort(gs) // the kernel keeps them sorted
				if !slices.Equal(gs, []int{4242, int(a.GID)}) {
					errs <- fmt.Sprintf("got groups %v, want %v", gs, a.Groups)
				}
				return nil
			})
			if err != nil {
				errs <- err.Error()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if bad := threadCreds(t, root); len(bad) > 0 {
		t.Errorf("threads left with other credentials than envd's (%s):\n%s", root, strings.Join(bad, "\n"))
	}
}

func TestAsUserPanicRestores(t *testing.T) {
	a := nobody(t)
	b, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		t.Fatal(err)
	}
	root := credLines(string(b))
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("got panic %v, want boom passed on to the caller", p)
			}
		}()
		asUser(a, func() error { panic("boom") })
	}()
	if bad := threadCreds(t, root); len(bad) > 0 {
		t.Errorf("threads left with other credentials than envd's (%s):\n%s", root, strings.Join(bad, "\n"))
	}
}
