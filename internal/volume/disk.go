package volume

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A volume made while Config.SizeMB is set keeps its contents in an ext4
// file system inside a sparse image file (disk.ext4 beside volume.json),
// loop-mounted at data/. Writing past its size fails with ENOSPC, inside
// sandboxes and through the content API alike; the image takes on the
// host only what was written. A volume made with SizeMB 0 is a plain
// directory without a limit (and so is every volume made before sizes).
//
// The mount outlives the server: sandboxes that keep running across a
// restart keep using it, and Open mounts only images that are not mounted
// (util-linux's mount reuses the loop device of an image already attached,
// so the file system is never mounted twice from two devices). Close
// unmounts the volumes no sandbox mounts.

const diskImage = "disk.ext4"

// makeDisk creates dir's sized image and mounts it at dir/data.
func makeDisk(ctx context.Context, dir string, sizeMB int64) error {
	img := filepath.Join(dir, diskImage)
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(sizeMB << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// No reserved blocks (the volume's user gets all of it); the inode
	// tables and journal are zeroed lazily, so a create takes milliseconds
	// and the image stays sparse.
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0",
		"-E", "lazy_itable_init=1,lazy_journal_init=1", img).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s (is e2fsprogs installed? run make setup; or serve with --volume-size-mb 0 for volumes without a size limit)", err, strings.TrimSpace(string(out)))
	}
	if err := mountDisk(ctx, dir); err != nil {
		return err
	}
	// A new volume is empty, as a directory volume is: ext4's lost+found
	// would show in every listing (fsck makes it again if it needs one).
	return os.Remove(filepath.Join(dir, "data", "lost+found"))
}

// mountDisk mounts dir's image at dir/data unless it is mounted already.
func mountDisk(ctx context.Context, dir string) error {
	data := filepath.Join(dir, "data")
	if ok, err := isMountPoint(data); err != nil || ok {
		return err
	}
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "mount", "-t", "ext4", "-o", "loop,nosuid,nodev",
		filepath.Join(dir, diskImage), data).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount volume image %s: %w: %s (loop devices are needed for sized volumes; serve with --volume-size-mb 0 for plain directories)", dir, err, strings.TrimSpace(string(out)))
	}
	// Every user inside a sandbox may write at the top, as on E2B.
	return os.Chmod(data, 0o777)
}

// unmountDisk unmounts dir/data if it is a mount point. A lazy unmount:
// a process still holding a file (a sandbox being torn down) keeps the
// file system until it lets go, and the loop device is freed then.
func unmountDisk(dir string) error {
	data := filepath.Join(dir, "data")
	ok, err := isMountPoint(data)
	if err != nil || !ok {
		return err
	}
	if err := unix.Unmount(data, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount volume %s: %w", dir, err)
	}
	return nil
}

// hasDisk reports whether dir keeps its contents in an image.
func hasDisk(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, diskImage))
	return err == nil
}

// isMountPoint reports whether p is a mount point in this process's mount
// namespace (/proc/self/mountinfo; p must be clean and absolute).
func isMountPoint(p string) (bool, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return false, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMount(fields[4]) == abs {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(byte(c))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// diskTimeout bounds making or mounting one volume's image.
const diskTimeout = 30 * time.Second
