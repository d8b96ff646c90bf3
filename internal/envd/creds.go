package envd

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ownGroups are envd's own gid and supplementary groups, restored after
// each switch.
var ownGroups = sync.OnceValues(func() (groups []uint32, err error) {
	gs, err := unix.Getgroups()
	for _, g := range gs {
		groups = append(groups, uint32(g))
	}
	return groups, err
})

// asUser runs fn with the credentials of a, so that the kernel (gVisor's)
// checks every path fn resolves as that user. File operations do not use
// it (they act as root, as E2B's envd); a command's working directory is
// checked with it, so that a chdir the command could not make is refused
// with a clear message.
//
// Only this goroutine's OS thread changes credentials, with raw per-thread
// syscalls (syscall.Setresuid and friends would change every thread of
// envd). fn runs on a fresh goroutine locked to that thread; it should make
// only the path syscalls (open, mkdir, rename, stat...): an *os.File it
// returns keeps the access checked at open and can be used on any thread.
// The saved uid stays 0 so the thread can switch back; if switching back
// fails the thread stays locked and ends with the goroutine.
//
// A request as envd's own user (root) runs fn as is; a non-root envd (a
// test) can act only as itself.
func asUser(a account, fn func() error) error {
	euid := uint32(unix.Geteuid())
	switch {
	case a.UID == euid:
		return fn()
	case euid != 0:
		return fmt.Errorf("envd runs as uid %d and cannot act as user %q (uid %d)", euid, a.Name, a.UID)
	}
	gid := uint32(unix.Getgid())
	groups, err := ownGroups()
	if err != nil {
		return fmt.Errorf("read envd's groups: %w", err)
	}
	type outcome struct {
		err      error
		panicked any
	}
	done := make(chan outcome, 1)
	go func() {
		runtime.LockOSThread()
		var out outcome
		defer func() {
			if p := recover(); p != nil {
				out.panicked = p
			}
			if err := setThreadCreds(0, gid, groups); err != nil {
				// The thread still has (part of) the user's credentials:
				// keep it locked so that it exits with this goroutine.
				out.err = fmt.Errorf("switch back from user %q: %w", a.Name, err)
			} else {
				runtime.UnlockOSThread()
			}
			done <- out
		}()
		if err := setThreadCreds(a.UID, a.GID, a.Groups); err != nil {
			out.err = fmt.Errorf("switch to user %q (uid %d): %w", a.Name, a.UID, err)
			return
		}
		out.err = fn()
	}()
	out := <-done
	if out.panicked != nil {
		panic(out.panicked)
	}
	return out.err
}

// setThreadCreds sets the calling thread's groups, gid and uid, in the
// order that keeps the privilege to do the next step. Going to a non-zero
// uid keeps 0 as the saved uid (capabilities stay permitted, not
// effective); going to uid 0 makes them effective again. The numbers are
// the 32-bit id calls of amd64 and arm64, gVisor's only platforms.
func setThreadCreds(uid, gid uint32, groups []uint32) error {
	if uid == 0 {
		// Regain root first: changing groups and gid needs it.
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, 0, 0, 0); e != 0 {
			return fmt.Errorf("setresuid: %w", e)
		}
	}
	var first *uint32
	if len(groups) > 0 {
		first = &groups[0]
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(first)), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), 0); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	if uid != 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), 0); e != 0 {
			return fmt.Errorf("setresuid: %w", e)
		}
	}
	return nil
}
