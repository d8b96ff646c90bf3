package envd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "agentenv/internal/envd/gen/filesystempb"
	"agentenv/internal/envd/gen/filesystempb/filesystempbconnect"
)

// filesystemService implements the Connect filesystem.Filesystem service.
type filesystemService struct {
	filesystempbconnect.UnimplementedFilesystemHandler
	watchers *watcherSet
}

func fsError(err error, path string) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("path %q does not exist", path))
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("path %q already exists", path))
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("permission denied: %q", path))
	case errors.Is(err, syscall.ENOTDIR):
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q is not a directory", path))
	case errors.Is(err, syscall.ENOTEMPTY):
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("directory %q is not empty", path))
	}
	return connect.NewError(connect.CodeInternal, err)
}

// entryInfo describes path (not following a final symlink).
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
		Type:         pb.FileType_FILE_TYPE_FILE,
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		e.Owner = userName(sys.Uid)
		e.Group = groupName(sys.Gid)
	}
	switch {
	case st.IsDir():
		e.Type = pb.FileType_FILE_TYPE_DIRECTORY
		e.Mode |= uint32(fs.ModeDir)
	case st.Mode()&fs.ModeSymlink != 0:
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		if t, err := os.Readlink(path); err == nil {
			e.SymlinkTarget = &t
		}
		// Report the type of what the link points at, as E2B does.
		if tst, err := os.Stat(path); err == nil && tst.IsDir() {
			e.Type = pb.FileType_FILE_TYPE_DIRECTORY
		}
	}
	return e, nil
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

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	acct, err := connectUser(req.Header())
	if err != nil {
		return nil, err
	}
	path := resolvePath(req.Msg.GetPath(), acct)
	e, err := entryInfo(path)
	if err != nil {
		return nil, fsError(err, path)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	acct, err := connectUser(req.Header())
	if err != nil {
		return nil, err
	}
	path := resolvePath(req.Msg.GetPath(), acct)
	if st, err := os.Stat(path); err == nil {
		if st.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %q already exists", path))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q exists and is not a directory", path))
	}
	if err := mkdirAllAs(path, acct); err != nil {
		return nil, fsError(err, path)
	}
	e, err := entryInfo(path)
	if err != nil {
		return nil, fsError(err, path)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

// mkdirAllAs creates path and any missing parents, owned by the user.
func mkdirAllAs(path string, a account) error {
	var missing []string
	for p := path; p != "/" && p != "."; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		}
		missing = append(missing, p)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := os.Lchown(missing[i], int(a.UID), int(a.GID)); err != nil {
			return err
		}
	}
	return nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	acct, err := connectUser(req.Header())
	if err != nil {
		return nil, err
	}
	src := resolvePath(req.Msg.GetSource(), acct)
	dst := resolvePath(req.Msg.GetDestination(), acct)
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError(err, src)
	}
	if err := mkdirAllAs(filepath.Dir(dst), acct); err != nil {
		return nil, fsError(err, dst)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError(err, dst)
	}
	e, err := entryInfo(dst)
	if err != nil {
		return nil, fsError(err, dst)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	acct, err := connectUser(req.Header())
	if err != nil {
		return nil, err
	}
	path := resolvePath(req.Msg.GetPath(), acct)
	if _, err := os.Lstat(path); err != nil {
		return nil, fsError(err, path)
	}
	if path == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	if err := os.RemoveAll(path); err != nil {
		return nil, fsError(err, path)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	acct, err := connectUser(req.Header())
	if err != nil {
		return nil, err
	}
	root := resolvePath(req.Msg.GetPath(), acct)
	depth := int(req.Msg.GetDepth())
	if depth <= 0 {
		depth = 1
	}
	st, err := os.Stat(root)
	if err != nil {
		return nil, fsError(err, root)
	}
	if !st.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q is not a directory", root))
	}
	out := &pb.ListDirResponse{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
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
	if err != nil {
		return nil, fsError(err, root)
	}
	return connect.NewResponse(out), nil
}
