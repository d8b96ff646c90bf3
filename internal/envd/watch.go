package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/agentenv/agentenv/internal/envd/gen/filesystempb"
)

// watch follows one directory (optionally its subdirectories) with inotify.
// Like every file operation, it runs as envd (root), as E2B's envd does;
// the user only names the path's home.
type watch struct {
	root         string
	recursive    bool
	includeEntry bool
	fd           int
	dirs         map[int]string
	events       chan *pb.FilesystemEvent
	stop         chan struct{}
	once         sync.Once
}

// watchMask holds the inotify events E2B's envd (fsnotify) reports: no
// IN_CLOSE_WRITE, so one write to a file is one write event.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF

func newWatch(acct account, root string, recursive, includeEntry, allowNetwork bool) (*watch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("inotify: %w", err))
	}
	w := &watch{root: root, recursive: recursive, includeEntry: includeEntry, fd: fd,
		dirs: map[int]string{}, events: make(chan *pb.FilesystemEvent, 1024), stop: make(chan struct{})}
	err = func() error {
		st, err := os.Stat(root)
		if err != nil {
			return err
		}
		if !st.IsDir() {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q is not a directory", root))
		}
		if err := checkNetworkMount(root, allowNetwork); err != nil {
			return err
		}
		return w.add(root, true)
	}()
	if err != nil {
		unix.Close(fd)
		return nil, fsError(err, acct, "watch", root)
	}
	go w.loop()
	return w, nil
}

// add watches dir and, when recursive, its subdirectories. Only the root
// may be reached through a symlink: a subdirectory swapped for one between
// its event and this call is not followed.
func (w *watch) add(dir string, root bool) error {
	mask := uint32(watchMask)
	if !root {
		mask |= unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW
	}
	wd, err := unix.InotifyAddWatch(w.fd, dir, mask)
	if err != nil {
		return &fs.PathError{Op: "watch", Path: dir, Err: err}
	}
	w.dirs[wd] = dir
	if !w.recursive {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	for _, e := range entries {
		if e.IsDir() {
			w.add(filepath.Join(dir, e.Name()), false)
		}
	}
	return nil
}

func (w *watch) close() {
	w.once.Do(func() { close(w.stop) })
}

func (w *watch) loop() {
	defer unix.Close(w.fd)
	defer close(w.events)
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds, 200); n <= 0 {
			continue
		}
		n, err := unix.Read(w.fd, buf)
		if err != nil || n <= 0 {
			continue
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if raw.Len > 0 {
				b := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(raw.Len)]
				for i, c := range b {
					if c == 0 {
						b = b[:i]
						break
					}
				}
				name = string(b)
			}
			off += unix.SizeofInotifyEvent + int(raw.Len)
			w.handle(int(raw.Wd), raw.Mask, name)
		}
	}
}

func (w *watch) handle(wd int, mask uint32, name string) {
	dir, ok := w.dirs[wd]
	if !ok || name == "" {
		return
	}
	full := filepath.Join(dir, name)
	newDir := w.recursive && mask&unix.IN_ISDIR != 0 && mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0
	if newDir {
		w.add(full, false)
	}
	rel, _ := filepath.Rel(w.root, full)
	for _, t := range eventTypes(mask) {
		ev := &pb.FilesystemEvent{Name: rel, Type: t}
		if w.includeEntry && carriesEntry(t) {
			ev.Entry, _ = entryInfo(full)
		}
		select {
		case w.events <- ev:
		case <-w.stop:
			return
		}
	}
}

// eventTypes maps an inotify mask to E2B's event types the way fsnotify
// (which E2B's envd uses) does: a file moved in is created, one moved out
// renamed.
func eventTypes(mask uint32) []pb.EventType {
	var ts []pb.EventType
	if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		ts = append(ts, pb.EventType_EVENT_TYPE_CREATE)
	}
	if mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0 {
		ts = append(ts, pb.EventType_EVENT_TYPE_RENAME)
	}
	if mask&unix.IN_ATTRIB != 0 {
		ts = append(ts, pb.EventType_EVENT_TYPE_CHMOD)
	}
	if mask&unix.IN_MODIFY != 0 {
		ts = append(ts, pb.EventType_EVENT_TYPE_WRITE)
	}
	if mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0 {
		ts = append(ts, pb.EventType_EVENT_TYPE_REMOVE)
	}
	return ts
}

// carriesEntry reports whether an event's path still names the entry it is
// about: after a remove or rename it may name a newcomer, so those events
// carry no entry (as in E2B).
func carriesEntry(t pb.EventType) bool {
	switch t {
	case pb.EventType_EVENT_TYPE_CREATE, pb.EventType_EVENT_TYPE_WRITE, pb.EventType_EVENT_TYPE_CHMOD:
		return true
	}
	return false
}

// Filesystem magic numbers (linux/magic.h) of network and FUSE mounts,
// which a watch refuses unless the client allows them (envd 0.6.4):
// inotify there misses changes made by other machines.
var networkFS = map[int64]string{
	0x6969:     "NFS",
	0xFF534D42: "CIFS",
	0x517B:     "SMB",
	0xFE534D42: "SMB2",
	0x65735546: "FUSE",
}

// checkNetworkMount refuses a watch of a network filesystem unless allowed.
func checkNetworkMount(path string, allowed bool) error {
	if allowed {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	if kind, ok := networkFS[int64(st.Type)]; ok {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q is on a network filesystem (%s), where changes made elsewhere are not seen: pass allowNetworkMounts to watch it anyway", path, kind))
	}
	return nil
}

func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	acct, path, err := request(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := newWatch(acct, path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return err
	}
	defer w.close()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(keepalive(req.Header()))
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-w.events:
			if !ok {
				return nil
			}
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		case <-tick.C:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// watcherSet holds the polling watchers (CreateWatcher/GetWatcherEvents).
type watcherSet struct {
	mu sync.Mutex
	m  map[string]*watch
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	acct, path, err := request(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := newWatch(acct, path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return nil, err
	}
	b := make([]byte, 8)
	rand.Read(b)
	id := hex.EncodeToString(b)
	f.watchers.mu.Lock()
	f.watchers.m[id] = w
	f.watchers.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystemService) watcher(id string) (*watch, error) {
	f.watchers.mu.Lock()
	defer f.watchers.mu.Unlock()
	w, ok := f.watchers.m[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	return w, nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	w, err := f.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	out := &pb.GetWatcherEventsResponse{}
	for {
		select {
		case ev, ok := <-w.events:
			if !ok {
				return connect.NewResponse(out), nil
			}
			out.Events = append(out.Events, ev)
			continue
		default:
		}
		return connect.NewResponse(out), nil
	}
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	w, err := f.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.close()
	f.watchers.mu.Lock()
	delete(f.watchers.m, req.Msg.GetWatcherId())
	f.watchers.mu.Unlock()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
