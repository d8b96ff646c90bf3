// Package envdapi holds what envd, the daemon inside every sandbox, and
// the host agree on: envd's port, the version it reports, the variable
// that hands it its token, its own routes and the bash shim it
// recognises. Host packages import it instead of the daemon.
//
// It must hold constants only and import nothing: envd's early listener
// (internal/envd/listener) imports it, and that package's init must run
// before any package with a heavy initialization.
package envdapi

// Port is the port envd listens on inside the sandbox.
const Port = 49983

// Version is reported to clients; the E2B SDK enables features by it.
// 0.6.4 is the newest version the JS SDK (2.51.0) checks for, and envd
// implements what every version up to it promises: server-chosen default
// user (0.4.0), CloseStdin (0.5.2), octet-stream and gzip uploads (0.5.7),
// file metadata xattrs (0.6.2), watch events with entries (0.6.3) and the
// network-mount watch option (0.6.4).
const Version = "0.6.4"

// TokenEnv names the environment variable that carries the access token to
// envd at start. envd removes it from its own environment.
const TokenEnv = "AGENTENV_ENVD_ACCESS_TOKEN"

// ChangesPath is the route of a sandbox's changed files: GET
// ?since=<Unix nanoseconds> answers the archive (a tar stream, described
// in internal/envd), POST with such an archive as body puts the files
// back. Both need the access token; they act as root, as the host's own
// operations.
const ChangesPath = "/agentenv/v1/changes"

// BashShim is the /bin/bash agentenv puts in a template without bash (a
// busybox one): E2B's SDKs run every command as `/bin/bash -l -c CMD`, and
// the script hands those arguments to sh. envd recognises it and starts
// sh itself.
const BashShim = "#!/bin/sh\nexec /bin/sh \"$@\"\n"
