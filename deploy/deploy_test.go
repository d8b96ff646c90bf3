package deploy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/agentenv/agentenv/internal/cli"
)

// command is an agentenv subcommand a deployment file runs: the flags it
// takes (each with a value) and those a deployment must give it.
type command struct {
	flags    []string
	required []string
}

// commands are the subcommands deployment files may run, and the flags
// they may pass: the deployments' contract with the binary, narrower than
// its flags. cliAccepts checks every command line against the real binary
// too.
var commands = map[string]command{
	"node": {
		flags: []string{"name", "etcd", "etcd-ca", "etcd-cert", "etcd-key", "listen", "advertise", "data-dir",
			"cluster-secret-file", "tls-cert", "tls-key", "tls-ca", "network-cidr", "max-sandboxes"},
		// A secure fleet: etcd with client certificates, mutual TLS
		// between the roles.
		required: []string{"name", "etcd", "etcd-ca", "etcd-cert", "etcd-key", "listen", "advertise", "data-dir",
			"cluster-secret-file", "tls-cert", "tls-key", "tls-ca"},
	},
	"api": {
		flags: []string{"etcd", "etcd-ca", "etcd-cert", "etcd-key", "listen", "proxy-listen", "cluster-secret-file",
			"tls-ca", "tls-cert", "tls-key", "operator-key-file"},
		// Without --operator-key-file nobody may cordon or drain a node.
		required: []string{"etcd", "etcd-ca", "etcd-cert", "etcd-key", "listen", "proxy-listen", "cluster-secret-file",
			"tls-ca", "tls-cert", "tls-key", "operator-key-file"},
	},
	"serve": {
		flags:    []string{"data-dir", "listen", "proxy-listen"},
		required: []string{"data-dir"},
	},
}

// fileFlags are the flags that name a file a deployment must deliver
// (a secret, a key, a certificate): the tests check where each comes from.
var fileFlags = []string{"cluster-secret-file", "operator-key-file", "etcd-ca", "etcd-cert", "etcd-key", "tls-ca", "tls-cert", "tls-key"}

// flagValues checks the value of each flag, after the deployment's
// variables are filled in with their example values.
var flagValues = map[string]func(string) error{
	"name":                nonEmpty,
	"etcd":                httpsURLList,
	"etcd-ca":             absPath,
	"etcd-cert":           absPath,
	"etcd-key":            absPath,
	"listen":              hostPort,
	"proxy-listen":        hostPort,
	"advertise":           advertiseAddr,
	"data-dir":            absPath,
	"cluster-secret-file": absPath,
	"operator-key-file":   absPath,
	"tls-cert":            absPath,
	"tls-key":             absPath,
	"tls-ca":              absPath,
	"network-cidr":        cidr,
	"max-sandboxes":       positiveInt,
}

// parseCommandLine checks args (without the program name) against the
// commands table: a known subcommand, known flags given once each with a
// valid value, every required flag, no positional arguments. It returns
// the subcommand and its flags.
func parseCommandLine(args []string) (string, map[string]string, error) {
	if len(args) == 0 {
		return "", nil, errors.New("no subcommand")
	}
	sub := args[0]
	cmd, ok := commands[sub]
	if !ok {
		return "", nil, fmt.Errorf("unknown subcommand %q: want one of node, api, serve", sub)
	}
	flags := map[string]string{}
	for i := 1; i < len(args); i++ {
		name, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			return "", nil, fmt.Errorf("%s: unexpected argument %q: every argument is a --flag", sub, args[i])
		}
		name, value, hasValue := strings.Cut(name, "=")
		if !hasValue {
			if i+1 == len(args) || strings.HasPrefix(args[i+1], "-") {
				return "", nil, fmt.Errorf("%s: --%s has no value", sub, name)
			}
			i++
			value = args[i]
		}
		if !slices.Contains(cmd.flags, name) {
			return "", nil, fmt.Errorf("%s: unknown flag --%s (known: %s)", sub, name, strings.Join(cmd.flags, ", "))
		}
		if _, dup := flags[name]; dup {
			return "", nil, fmt.Errorf("%s: --%s given twice", sub, name)
		}
		if err := flagValues[name](value); err != nil {
			return "", nil, fmt.Errorf("%s: --%s %q: %w", sub, name, value, err)
		}
		flags[name] = value
	}
	for _, name := range cmd.required {
		if _, ok := flags[name]; !ok {
			return "", nil, fmt.Errorf("%s: missing --%s", sub, name)
		}
	}
	return sub, flags, nil
}

// cliAccepts parses args (without the program name) with agentenv's real
// command tree, so a flag that the binary lacks or a value of the wrong type
// fails too.
func cliAccepts(args []string) error {
	root := cli.Root()
	var cmd *cobra.Command
	for _, c := range root.Commands() {
		if c.Name() == args[0] {
			cmd = c
		}
	}
	if cmd == nil {
		return fmt.Errorf("agentenv has no command %q", args[0])
	}
	if err := cmd.ParseFlags(args[1:]); err != nil {
		return fmt.Errorf("agentenv %s: %w", args[0], err)
	}
	if rest := cmd.Flags().Args(); len(rest) > 0 {
		return fmt.Errorf("agentenv %s: unexpected arguments %q", args[0], rest)
	}
	return nil
}

// checkCommandLine checks args against the commands table and the real
// binary, and returns the flags.
func checkCommandLine(t *testing.T, args []string) map[string]string {
	t.Helper()
	_, flags, err := parseCommandLine(args)
	if err == nil {
		err = cliAccepts(args)
	}
	if err != nil {
		t.Errorf("command line %q: %v", args, err)
		return nil
	}
	return flags
}

func nonEmpty(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("empty")
	}
	return nil
}

// httpsURLList is etcd's endpoints as a deployment gives them: https://
// only, since the fleet's etcd is reached from other hosts and must see
// the roles' client certificates.
func httpsURLList(s string) error {
	for u := range strings.SplitSeq(s, ",") {
		p, err := url.Parse(u)
		if err != nil {
			return err
		}
		if p.Scheme != "https" || p.Host == "" || p.Port() == "" {
			return fmt.Errorf("%q is not an https://host:port URL: a deployed fleet reaches etcd over TLS with client certificates", u)
		}
	}
	return nil
}

func hostPort(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("bad port %q", port)
	}
	return nil
}

// advertiseAddr is a host:port other machines can dial: not a wildcard.
func advertiseAddr(s string) error {
	if err := hostPort(s); err != nil {
		return err
	}
	host, _, _ := net.SplitHostPort(s)
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		return errors.New("not an address other machines can dial")
	}
	return nil
}

func absPath(s string) error {
	if !filepath.IsAbs(s) || filepath.Clean(s) != s {
		return errors.New("not a clean absolute path")
	}
	return nil
}

func cidr(s string) error {
	_, err := netip.ParsePrefix(s)
	return err
}

func positiveInt(s string) error {
	if n, err := strconv.Atoi(s); err != nil || n < 1 {
		return errors.New("not a positive integer")
	}
	return nil
}

// portOf returns the port number of a host:port flag value.
func portOf(t *testing.T, hostport string) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatalf("%q: %v", hostport, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("%q: %v", hostport, err)
	}
	return int32(n)
}

// TestCheckersRejectMistakes proves the checks the other tests rely on are
// strict: each misspelling below must fail, and the correct twin must pass.
func TestCheckersRejectMistakes(t *testing.T) {
	manifest := func(s string) error { _, err := decodeManifests([]byte(s)); return err }
	kustomization := func(s string) error { _, err := decodeKustomization([]byte(s)); return err }
	unitFile := func(s string) error { _, err := parseUnit(strings.NewReader(s)); return err }
	args := func(s string) error { _, _, err := parseCommandLine(strings.Fields(s)); return err }
	binary := func(s string) error { return cliAccepts(strings.Fields(s)) }

	const daemonSet = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: n\nspec:\n  template:\n    spec:\n"
	const (
		etcdAuth = " --etcd-ca /e/ca --etcd-cert /e/c --etcd-key /e/k"
		mtls     = " --tls-ca /t/ca --tls-cert /t/c --tls-key /t/k"
		node     = "node --name n --etcd https://e:2379" + etcdAuth + mtls + " --listen :3100 --data-dir /d --cluster-secret-file /s"
		api      = "api --etcd https://e:2379" + etcdAuth + mtls + " --listen :3000 --proxy-listen :3001 --cluster-secret-file /s"
	)
	tests := []struct {
		name    string
		check   func(string) error
		input   string
		wantErr string // "" means the input is valid
	}{
		{"daemonset", manifest, daemonSet + "      hostNetwork: true\n", ""},
		{"daemonset misspelled field", manifest, daemonSet + "      hostNetwrok: true\n", `unknown field "hostNetwrok"`},
		{"container misspelled field", manifest, daemonSet + "      containers:\n        - name: c\n          imagePulPolicy: Always\n", `unknown field "imagePulPolicy"`},
		{"field of the wrong type", manifest, "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  replicas: two\n", "cannot unmarshal string"},
		{"duplicate field", manifest, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  name: b\n", "already set"},
		{"wrong apiVersion", manifest, "apiVersion: v1\nkind: DaemonSet\nmetadata:\n  name: n\n", `want "apps/v1"`},
		{"unknown kind", manifest, "apiVersion: v1\nkind: Namespce\nmetadata:\n  name: n\n", "unknown kind"},
		{"second document checked", manifest, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Service\nspec:\n  selectr: {}\n", `unknown field "selectr"`},
		{"kustomization", kustomization, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - a.yaml\n", ""},
		{"kustomization misspelled field", kustomization, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresource:\n  - a.yaml\n", `unknown field "resource"`},
		{"kustomization wrong kind", kustomization, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Component\n", "got kustomize.config.k8s.io/v1beta1 Component"},
		{"unit", unitFile, "[Service]\nRestart=on-failure\n", ""},
		{"unit misspelled option", unitFile, "[Service]\nRestrat=on-failure\n", `unknown option Restrat= in [Service]`},
		{"unit misspelled section", unitFile, "[Servce]\nRestart=on-failure\n", "unknown section [Servce]"},
		{"unit option in the wrong section", unitFile, "[Service]\nWantedBy=multi-user.target\n", "unknown option WantedBy= in [Service]"},
		{"node command line", args, node + " --advertise 10.0.0.1:3100", ""},
		{"api command line", args, api + " --operator-key-file /o", ""},
		{"unknown subcommand", args, "nodes --name n", `unknown subcommand "nodes"`},
		{"misspelled flag", args, api + " --operator-key-flie /o", "unknown flag --operator-key-flie"},
		{"missing required flag", args, strings.Replace(api, " --etcd https://e:2379", "", 1) + " --operator-key-file /o", "missing --etcd"},
		{"api without the operator key", args, api, "missing --operator-key-file"},
		{"node without mutual TLS", args, strings.Replace(node, mtls, " --tls-cert /t/c --tls-key /t/k", 1) + " --advertise 10.0.0.1:3100", "missing --tls-ca"},
		{"node without etcd's client certificate", args, strings.Replace(node, etcdAuth, " --etcd-ca /e/ca", 1) + " --advertise 10.0.0.1:3100", "missing --etcd-cert"},
		{"plain etcd", args, strings.Replace(node, "https://e:2379", "https://e:2379,http://f:2379", 1) + " --advertise 10.0.0.1:3100", "not an https://host:port URL"},
		{"relative certificate path", args, strings.Replace(api, "--tls-ca /t/ca", "--tls-ca t/ca", 1) + " --operator-key-file /o", "not a clean absolute path"},
		{"positional argument", args, "serve --data-dir /d extra", `unexpected argument "extra"`},
		{"bad flag value", args, "serve --data-dir var/lib", "not a clean absolute path"},
		{"binary accepts", binary, "node --etcd https://e:2379 --max-sandboxes 10", ""},
		{"binary accepts the secure api", binary, api + " --operator-key-file /o", ""},
		{"binary lacks the flag", binary, "api --etcd https://e:2379 --proxy-listn :3001", "unknown flag: --proxy-listn"},
		{"binary rejects the value", binary, "node --max-sandboxes many", "invalid argument"},
		{"binary lacks the command", binary, "nodes --etcd https://e:2379", `no command "nodes"`},
		{"wildcard advertise address", args, node + " --advertise 0.0.0.0:3100", "other machines"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check(tt.input)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("got error %v, want none", err)
			case tt.wantErr != "" && err == nil:
				t.Errorf("got no error, want one containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Errorf("got error %q, want one containing %q", err, tt.wantErr)
			}
		})
	}
}
