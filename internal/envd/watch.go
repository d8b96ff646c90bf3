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

	pb "github.com/agentenv/agentenv/client/api/envd/filesystempb"
)

// watch follows one directory (optionally its subdirectories) with inotify.
// Like every file operation, it runs as envd (root), as E2B's envd does;
// the user only names the path's home.
//
// A goroutine moves what the kernel queues into pending, for WatchDir's
// stream; GetWatcherEvents reads the kernel's queue itself before it
// answers, so that every change made before the call is in its answer
// (the kernel queues an event in the syscall that made the change), not
// only those the goroutine has got to.
type watch struct {
	root         string
	recursive    bool
	includeEntry bool

	// mu serializes reads of the inotify queue; it guards fd (-1 once
	// closed), dirs and pending.
	mu      sync.Mutex
	fd      int
	buf     []byte
	dirs    map[int]string
	pending []*pb.FilesystemEvent
	// ready is signalled when pending gets events, room when they are
	// taken (the goroutine stops reading at maxPending until then).
	ready chan struct{}
	room  chan struct{}
	stop  chan struct{}
	once  sync.Once
}

// maxPending bounds the events read and not yet taken: past it the kernel
// keeps them (and drops what overflows its own queue).
const maxPending = 1024

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
		buf: make([]byte, 64<<10), dirs: map[int]string{},
		ready: make(chan struct{}, 1), room: make(chan struct{}, 1), stop: make(chan struct{})}
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
// its event and this call is not followed. Callers hold w.mu (or own w).
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

// loop reads the kernel's queue as events arrive, until the watch is
// closed; then it closes the inotify descriptor.
func (w *watch) loop() {
	defer func() {
		w.mu.Lock()
		unix.Close(w.fd)
		w.fd = -1
		w.mu.Unlock()
	}()
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		w.mu.Lock()
		full := len(w.pending) >= maxPending
		w.mu.Unlock()
		if full {
			select {
			case <-w.room:
			case <-w.stop:
				return
			}
			continue
		}
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds, 200); n <= 0 {
			continue
		}
		w.mu.Lock()
		w.readLocked()
		w.mu.Unlock()
	}
}

// readLocked moves the events the kernel has queued into pending, until
// the queue is empty (it then reports true) or pending is full. Callers
// hold w.mu.
func (w *watch) readLocked() bool {
	for w.fd >= 0 && len(w.pending) < maxPending {
		n, err := unix.Read(w.fd, w.buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return true
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&w.buf[off]))
			name := ""
			if raw.Len > 0 {
				b := w.buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(raw.Len)]
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
	return w.fd < 0
}

// take returns the events read and not yet taken.
func (w *watch) take() []*pb.FilesystemEvent {
	w.mu.Lock()
	evs := w.pending
	w.pending = nil
	w.mu.Unlock()
	w.signal(w.room)
	return evs
}

// drain returns every event queued by now: those read already and what
// the kernel still holds.
func (w *watch) drain() []*pb.FilesystemEvent {
	w.mu.Lock()
	var evs []*pb.FilesystemEvent
	for {
		done := w.readLocked()
		evs = append(evs, w.pending...)
		w.pending = nil
		if done {
			break
		}
	}
	w.mu.Unlock()
	w.signal(w.room)
	return evs
}

func (w *watch) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// handle queues the events of one inotify record. Callers hold w.mu.
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
		w.pending = append(w.pending, ev)
	}
	w.signal(w.ready)
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
		case <-w.ready:
			for _, ev := range w.take() {
				if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
					return err
				}
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
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: w.drain()}), nil
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
