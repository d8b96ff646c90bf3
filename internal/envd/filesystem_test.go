package envd_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/agentenv/agentenv/client/api/envd/filesystempb"
	"github.com/agentenv/agentenv/internal/envd"
)

func statReq(path string) *pb.StatRequest { return &pb.StatRequest{Path: path} }

func mustWrite(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestStat(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "f.txt")
	mustWrite(t, file, "12345")
	if err := os.Chmod(file, 0o640); err != nil {
		t.Fatal(err)
	}
	link, dirLink, dangling := filepath.Join(dir, "link"), filepath.Join(dir, "dirlink"), filepath.Join(dir, "dangling")
	for target, l := range map[string]string{"f.txt": link, ".": dirLink, "nowhere": dangling} {
		if err := os.Symlink(target, l); err != nil {
			t.Fatal(err)
		}
	}
	rel, err := filepath.Rel(d.home, file)
	if err != nil {
		t.Fatal(err)
	}
	// E2B's envd: mode is permission bits only; a symlink has the type and
	// mode of what it resolves to, and the resolved absolute path as target.
	tests := []struct {
		name, path, wantPath string
		typ                  pb.FileType
		mode                 uint32
		size                 int64
		target               string
	}{
		{"file", file, file, pb.FileType_FILE_TYPE_FILE, 0o640, 5, ""},
		{"relative to home", rel, file, pb.FileType_FILE_TYPE_FILE, 0o640, 5, ""},
		{"directory", dir, dir, pb.FileType_FILE_TYPE_DIRECTORY, 0o750, -1, ""},
		{"symlink to a file", link, link, pb.FileType_FILE_TYPE_FILE, 0o640, -1, file},
		{"symlink to a directory", dirLink, dirLink, pb.FileType_FILE_TYPE_DIRECTORY, 0o750, -1, dir},
		{"dangling symlink", dangling, dangling, pb.FileType_FILE_TYPE_UNSPECIFIED, 0, -1, dangling},
		{"empty is home", "", d.home, pb.FileType_FILE_TYPE_DIRECTORY, 0, -1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := d.fs.Stat(context.Background(), connect.NewRequest(statReq(tt.path)))
			if err != nil {
				t.Fatalf("Stat(%q): %v", tt.path, err)
			}
			e := resp.Msg.GetEntry()
			if e.GetPath() != tt.wantPath || e.GetName() != filepath.Base(tt.wantPath) || e.GetType() != tt.typ {
				t.Errorf("got path %q name %q type %v, want %q %q %v", e.GetPath(), e.GetName(), e.GetType(), tt.wantPath, filepath.Base(tt.wantPath), tt.typ)
			}
			if tt.size >= 0 && e.GetSize() != tt.size {
				t.Errorf("got size %d, want %d", e.GetSize(), tt.size)
			}
			if tt.path != "" && e.GetMode() != tt.mode {
				t.Errorf("got mode %d (%#o), want %d (%#o)", e.GetMode(), e.GetMode(), tt.mode, tt.mode)
			}
			if got := e.GetSymlinkTarget(); got != tt.target || (tt.target == "") != (e.SymlinkTarget == nil) {
				t.Errorf("got symlink target %q (set %v), want %q", got, e.SymlinkTarget != nil, tt.target)
			}
			if e.GetPermissions() == "" || e.GetOwner() == "" || e.GetModifiedTime() == nil {
				t.Errorf("got entry %v, want permissions, owner and modified time set", e)
			}
		})
	}
	_, err = d.fs.Stat(context.Background(), connect.NewRequest(statReq(filepath.Join(dir, "missing"))))
	if got := connect.CodeOf(err); got != connect.CodeNotFound {
		t.Errorf("Stat of a missing path: got %v, want not_found (the SDK's exists() relies on it)", err)
	}
}

func TestListDir(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "f.txt"), "x")
	mustWrite(t, filepath.Join(dir, "a", "g.txt"), "x")
	mustWrite(t, filepath.Join(dir, "a", "b", "h.txt"), "x")
	tests := []struct {
		depth uint32
		want  []string
	}{
		{0, []string{"a", "f.txt"}}, // the SDK never sends 0; treat it as 1
		{1, []string{"a", "f.txt"}},
		{2, []string{"a", "a/b", "a/g.txt", "f.txt"}},
		{3, []string{"a", "a/b", "a/b/h.txt", "a/g.txt", "f.txt"}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("depth ", tt.depth), func(t *testing.T) {
			resp, err := d.fs.ListDir(context.Background(), connect.NewRequest(&pb.ListDirRequest{Path: dir, Depth: tt.depth}))
			if err != nil {
				t.Fatalf("ListDir: %v", err)
			}
			var got []string
			for _, e := range resp.Msg.GetEntries() {
				rel, _ := filepath.Rel(dir, e.GetPath())
				got = append(got, rel)
				if e.GetType() == pb.FileType_FILE_TYPE_UNSPECIFIED {
					t.Errorf("entry %q has no type (the SDK drops it)", rel)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	_, err := d.fs.ListDir(context.Background(), connect.NewRequest(&pb.ListDirRequest{Path: filepath.Join(dir, "missing"), Depth: 1}))
	if got := connect.CodeOf(err); got != connect.CodeNotFound {
		t.Errorf("ListDir of a missing directory: got %v, want not_found", err)
	}
}

func TestMakeDirMoveRemove(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	ctx := context.Background()
	dir := t.TempDir()

	nested := filepath.Join(dir, "x", "y", "z")
	resp, err := d.fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: nested}))
	if err != nil {
		t.Fatalf("MakeDir: %v", err)
	}
	if e := resp.Msg.GetEntry(); e.GetPath() != nested || e.GetType() != pb.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("MakeDir: got entry %v, want directory %s", e, nested)
	}
	if st, err := os.Stat(nested); err != nil || !st.IsDir() {
		t.Fatalf("MakeDir did not create %s (parents included): %v", nested, err)
	}
	_, err = d.fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: nested}))
	if got := connect.CodeOf(err); got != connect.CodeAlreadyExists {
		t.Errorf("second MakeDir: got %v, want already_exists (the SDK's makeDir returns false on it)", err)
	}

	src := filepath.Join(dir, "src.txt")
	mustWrite(t, src, "moved")
	dst := filepath.Join(dir, "new", "dst.txt")
	mresp, err := d.fs.Move(ctx, connect.NewRequest(&pb.MoveRequest{Source: src, Destination: dst}))
	if err != nil {
		t.Fatalf("Move: %v", err)
	}
	if e := mresp.Msg.GetEntry(); e.GetPath() != dst || e.GetName() != "dst.txt" {
		t.Errorf("Move: got entry %v, want %s", e, dst)
	}
	if got := readFile(t, dst); got != "moved" {
		t.Errorf("got moved content %q, want moved", got)
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Errorf("source still exists after Move: %v", err)
	}
	_, err = d.fs.Move(ctx, connect.NewRequest(&pb.MoveRequest{Source: src, Destination: dst}))
	if got := connect.CodeOf(err); got != connect.CodeNotFound {
		t.Errorf("Move of a missing source: got %v, want not_found", err)
	}

	for _, p := range []string{dst, filepath.Join(dir, "x")} {
		if _, err := d.fs.Remove(ctx, connect.NewRequest(&pb.RemoveRequest{Path: p})); err != nil {
			t.Errorf("Remove(%s): %v", p, err)
		}
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Remove: %v", p, err)
		}
	}
	// E2B's envd removes with RemoveAll: a missing path is no error.
	if _, err := d.fs.Remove(ctx, connect.NewRequest(&pb.RemoveRequest{Path: dst})); err != nil {
		t.Errorf("Remove of a missing path: got %v, want success (as E2B)", err)
	}
}

func TestWatchDir(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := d.fs.WatchDir(ctx, connect.NewRequest(&pb.WatchDirRequest{Path: dir}))
	if err != nil {
		t.Fatalf("WatchDir: %v", err)
	}
	defer s.Close()
	if !s.Receive() {
		t.Fatalf("WatchDir: no first message: %v", s.Err())
	}
	if s.Msg().GetStart() == nil {
		t.Fatalf("got first message %v, want the start event", s.Msg())
	}
	mustWrite(t, filepath.Join(dir, "new.txt"), "x")
	for s.Receive() {
		ev := s.Msg().GetFilesystem()
		if ev == nil {
			continue
		}
		if ev.GetType() == pb.EventType_EVENT_TYPE_UNSPECIFIED {
			t.Errorf("got event %v with no type (the SDK skips it)", ev)
		}
		if ev.GetName() == "new.txt" && ev.GetType() == pb.EventType_EVENT_TYPE_CREATE {
			return
		}
	}
	t.Fatalf("stream ended without a create event for new.txt: %v", s.Err())
}

func TestWatchDirErrors(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	mustWrite(t, file, "x")
	tests := []struct {
		name, path string
		code       connect.Code
	}{
		{"missing", filepath.Join(dir, "missing"), connect.CodeNotFound},
		{"not a directory", file, connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s, err := d.fs.WatchDir(ctx, connect.NewRequest(&pb.WatchDirRequest{Path: tt.path}))
			if err == nil {
				for s.Receive() {
					t.Errorf("got message %v, want an error", s.Msg())
				}
				err = s.Err()
				s.Close()
			}
			if got := connect.CodeOf(err); got != tt.code {
				t.Errorf("got %v, want %v", err, tt.code)
			}
		})
	}
}
