package envd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/agentenv/agentenv/client/api/envd/filesystempb"
	"github.com/agentenv/agentenv/client/api/envd/filesystempb/filesystempbconnect"
)

// filesystemService implements the Connect filesystem.Filesystem service.
type filesystemService struct {
	filesystempbconnect.UnimplementedFilesystemHandler
	watchers *watcherSet
}

// fsError maps the error of a user's file operation (op on path) to a
// Connect error that says what failed.
func fsError(err error, a account, op, path string) error {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return ce
	case errors.Is(err, errNUL):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("path %q does not exist", path))
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("path %q already exists", path))
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, errors.New(deniedMessage(err, a, op, path)))
	case errors.Is(err, syscall.ENOTDIR):
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q is not a directory", path))
	case errors.Is(err, syscall.ENOTEMPTY):
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("directory %q is not empty", path))
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("%s %q as user %q: %w", op, path, a.Name, err))
}

// deniedMessage says which user was refused what, where. File operations
// act as root, so only the sandbox's kernel refuses them (a /proc file
// that cannot change owner...); a command's working directory is checked
// as its user, who may ask as root instead.
func deniedMessage(err error, a account, op, path string) string {
	msg := fmt.Sprintf("permission denied: user %q cannot %s %q", a.Name, op, path)
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path != path {
		msg += fmt.Sprintf(" (refused at %q)", pe.Path)
	}
	return msg
}

// entryInfo describes path as E2B's envd does: a symlink is reported with
// the type and permission bits of what it leads to and the resolved
// absolute path as its target; mode carries permission bits only (no Go
// file-type bits); metadata is the entry's user.e2b.* xattrs.
func entryInfo(path string) (*pb.EntryInfo, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	e := &pb.EntryInfo{
		Name:         filepath.Base(path),
		Path:         path,
		Size:         st.Size(),
		Mode:         uint32(st.Mode().Perm()),
		Permissions:  st.Mode().String(),
		ModifiedTime: timestamppb.New(st.ModTime()),
		Type:         fileType(st.Mode()),
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		e.Owner = userName(sys.Uid)
		e.Group = groupName(sys.Gid)
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		// A link that does not resolve names itself, and its type and
		// mode stay unknown.
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			target = path
		}
		e.SymlinkTarget = &target
		e.Type, e.Mode = pb.FileType_FILE_TYPE_UNSPECIFIED, 0
		if tst, err := os.Stat(target); err == nil {
			e.Type, e.Mode = fileType(tst.Mode()), uint32(tst.Mode().Perm())
		}
	}
	// Best effort, as the entry itself is valid without it.
	e.Metadata, _ = readMetadata(path)
	return e, nil
}

func fileType(m fs.FileMode) pb.FileType {
	switch {
	case m.IsRegular():
		return pb.FileType_FILE_TYPE_FILE
	case m.IsDir():
		return pb.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		return pb.FileType_FILE_TYPE_SYMLINK
	}
	return pb.FileType_FILE_TYPE_UNSPECIFIED
}

func userName(uid uint32) string {
	if u, err := user.LookupId(strconv.Itoa(int(uid))); err == nil {
		return u.Username
	}
	return strconv.Itoa(int(uid))
}

func groupName(gid uint32) string {
	if g, err := user.LookupGroupId(strconv.Itoa(int(gid))); err == nil {
		return g.Name
	}
	return strconv.Itoa(int(gid))
}

// ensureDirs makes the missing directories of dir, from the top down, each
// 0755 and owned by the user (E2B's envd, which acts as root for file
// operations, does the same: even under "/"). Existing directories keep
// their owner; an existing non-directory on the way is an error.
func ensureDirs(dir string, a account) error {
	var missing []string
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err == nil {
			if !st.IsDir() {
				return &fs.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		missing = append(missing, p)
		if p == "/" {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		p := missing[i]
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		// Also when another request made it meanwhile, which may not have
		// chowned it yet (E2B's envd does the same).
		if err := os.Lchown(p, int(a.UID), int(a.GID)); err != nil {
			return err
		}
	}
	return nil
}

// request resolves the user of a Connect request and a path of it.
func request(h http.Header, path string) (account, string, error) {
	acct, err := connectUser(h)
	if err != nil {
		return account{}, "", err
	}
	p, err := resolvePath(path, acct)
	if err != nil {
		return account{}, "", connect.NewError(connect.CodeInvalidArgument, err)
	}
	return acct, p, nil
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	acct, path, err := request(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := entryInfo(path)
	if err != nil {
		return nil, fsError(err, acct, "stat", path)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	acct, path, err := request(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := func() (*pb.EntryInfo, error) {
		if st, err := os.Stat(path); err == nil {
			if st.IsDir() {
				return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %q already exists", path))
			}
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q exists and is not a directory", path))
		}
		if err := ensureDirs(path, acct); err != nil {
			return nil, err
		}
		return entryInfo(path)
	}()
	if err != nil {
		return nil, fsError(err, acct, "create directory", path)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	acct, src, err := request(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := resolvePath(req.Msg.GetDestination(), acct)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError(err, acct, "move", src)
	}
	// The moved entry keeps its owner; directories made for it are the
	// user's, as in E2B.
	e, err := func() (*pb.EntryInfo, error) {
		if err := ensureDirs(filepath.Dir(dst), acct); err != nil {
			return nil, err
		}
		if err := os.Rename(src, dst); err != nil {
			return nil, err
		}
		return entryInfo(dst)
	}()
	if err != nil {
		return nil, fsError(err, acct, "move "+strconv.Quote(src)+" to", dst)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	acct, path, err := request(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if path == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	// A path that does not exist is already removed: success, as in E2B.
	if err := os.RemoveAll(path); err != nil {
		return nil, fsError(err, acct, "remove", path)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	acct, root, err := request(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth <= 0 {
		depth = 1
	}
	out := &pb.ListDirResponse{}
	err = func() error {
		st, err := os.Stat(root)
		if err != nil {
			return err
		}
		if !st.IsDir() {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q is not a directory", root))
		}
		return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == root {
					return err
				}
				return nil // an entry vanished or is unreadable: skip it
			}
			if p == root {
				return nil
			}
			rel, _ := filepath.Rel(root, p)
			level := strings.Count(rel, string(filepath.Separator)) + 1
			e, err := entryInfo(p)
			if err != nil {
				return nil
			}
			out.Entries = append(out.Entries, e)
			if d.IsDir() && level >= depth {
				return filepath.SkipDir
			}
			return nil
		})
	}()
	if err != nil {
		return nil, fsError(err, acct, "list", root)
	}
	return connect.NewResponse(out), nil
}
