package envd

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// File metadata (envd 0.6.2): an upload's X-Metadata-<key> headers become
// user.e2b.<key> extended attributes of the file, and EntryInfo.metadata
// reads them back. The names and limits are E2B's, so files carry the same
// metadata whichever envd wrote them.
const (
	metadataHeaderPrefix = "X-Metadata-"
	metadataXattrPrefix  = "user.e2b."
	// The kernel limits an xattr name to 255 bytes, prefix included.
	maxMetadataKeyLen = 255 - len(metadataXattrPrefix)
	// One filesystem block holds every xattr of an inode on ext4; a set
	// larger than this could not be stored wherever the file moves.
	maxMetadataTotalLen = 4096
)

// metadataFromHeaders returns the X-Metadata-* headers of an upload, the
// prefix stripped and keys lower-cased (HTTP header names are case-blind).
func metadataFromHeaders(h http.Header) map[string]string {
	var md map[string]string
	for name, values := range h {
		if len(values) == 0 || len(name) <= len(metadataHeaderPrefix) || !strings.EqualFold(name[:len(metadataHeaderPrefix)], metadataHeaderPrefix) {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[strings.ToLower(name[len(metadataHeaderPrefix):])] = values[0]
	}
	return md
}

// validateMetadata refuses metadata that could not be stored: keys and
// values must be printable US-ASCII (what an HTTP header carries intact),
// keys short enough for an xattr name, the whole set within one block.
func validateMetadata(md map[string]string) error {
	total := 0
	for k, v := range md {
		if k == "" {
			return errors.New("metadata key must not be empty")
		}
		if len(k) > maxMetadataKeyLen {
			return fmt.Errorf("metadata key %q is longer than %d bytes", k, maxMetadataKeyLen)
		}
		if err := printableASCII("key", k); err != nil {
			return err
		}
		if err := printableASCII(fmt.Sprintf("value of key %q", k), v); err != nil {
			return err
		}
		total += len(metadataXattrPrefix) + len(k) + len(v)
	}
	if total > maxMetadataTotalLen {
		return fmt.Errorf("metadata takes %d bytes, more than the limit of %d: store less", total, maxMetadataTotalLen)
	}
	return nil
}

func printableASCII(what, s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("metadata %s has byte 0x%02x at offset %d: only printable US-ASCII is allowed", what, c, i)
		}
	}
	return nil
}

// writeMetadata replaces the file's metadata with md (nil clears it): an
// overwritten file keeps its xattrs, so keys the new upload lacks go.
func writeMetadata(f *os.File, md map[string]string, created bool) error {
	fd := int(f.Fd())
	var names []string
	if !created { // a new file has no metadata to remove
		var err error
		if names, err = listXattrs(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) }); err != nil {
			return err
		}
	}
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if _, keep := md[key]; !ok || keep {
			continue
		}
		if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return err
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(fd, metadataXattrPrefix+k, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}

// readMetadata returns path's metadata (following a final symlink), nil
// when it has none or its filesystem has no xattrs.
func readMetadata(path string) (map[string]string, error) {
	names, err := listXattrs(func(b []byte) (int, error) { return unix.Listxattr(path, b) })
	if err != nil {
		if xattrUnsupported(err) {
			return nil, nil
		}
		return nil, err
	}
	var md map[string]string
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if !ok {
			continue
		}
		v, err := getXattr(path, name)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, err
		}
		// Set inside the sandbox (setfattr), a value may be any bytes; a
		// protobuf string must be UTF-8 or the whole response fails.
		if !utf8.ValidString(key) || !utf8.Valid(v) {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(v)
	}
	return md, nil
}

func xattrUnsupported(err error) bool {
	return errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EOPNOTSUPP)
}

// listXattrs calls a listxattr variant with a growing buffer.
func listXattrs(list func([]byte) (int, error)) ([]string, error) {
	size, err := list(nil)
	for tries := 0; err == nil && tries < 4; tries++ {
		if size == 0 {
			return nil, nil
		}
		buf := make([]byte, size)
		var n int
		n, err = list(buf)
		if errors.Is(err, unix.ERANGE) {
			size, err = list(nil) // it grew meanwhile
			continue
		}
		if err != nil {
			break
		}
		var names []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
	if err == nil {
		err = unix.ERANGE
	}
	return nil, err
}

func getXattr(path, name string) ([]byte, error) {
	size, err := unix.Getxattr(path, name, nil)
	for tries := 0; err == nil && tries < 4; tries++ {
		buf := make([]byte, size)
		var n int
		n, err = unix.Getxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			size, err = unix.Getxattr(path, name, nil)
			continue
		}
		if err != nil {
			break
		}
		return buf[:n], nil
	}
	if err == nil {
		err = unix.ERANGE
	}
	return nil, err
}
