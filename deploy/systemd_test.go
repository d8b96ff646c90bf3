package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"
)

const (
	systemdDir    = "systemd"
	agentenvBin   = "/usr/local/bin/agentenv"
	configDir     = "/etc/agentenv"
	clusterSecret = "/etc/agentenv/cluster-secret"
)

// systemdOptions are the options the units may set, by section: a common
// part of systemd.unit(5), .service(5), .exec(5), .kill(5) and
// .resource-control(5) in systemd 252 (Debian 12). To use another, check
// its spelling there and add it; TestSystemdOptionsExist checks this list
// against the local systemd.
var systemdOptions = map[string][]string{
	"Unit": {
		"Description", "Documentation", "Wants", "Requires", "Requisite", "BindsTo", "PartOf",
		"Conflicts", "Before", "After", "OnFailure", "DefaultDependencies",
		"StartLimitIntervalSec", "StartLimitBurst",
		"ConditionPathExists", "ConditionPathIsDirectory", "ConditionFileNotEmpty",
		"AssertPathExists", "AssertPathIsDirectory", "AssertFileNotEmpty",
	},
	"Service": {
		// systemd.service(5)
		"Type", "RemainAfterExit", "PIDFile", "ExecStart", "ExecStartPre", "ExecStartPost",
		"ExecReload", "ExecStop", "ExecStopPost", "RestartSec", "TimeoutStartSec", "TimeoutStopSec",
		"TimeoutSec", "WatchdogSec", "Restart", "SuccessExitStatus", "RestartPreventExitStatus",
		"NotifyAccess", "OOMPolicy",
		// systemd.exec(5)
		"WorkingDirectory", "User", "Group", "DynamicUser", "SupplementaryGroups",
		"Environment", "EnvironmentFile", "PassEnvironment", "UnsetEnvironment",
		"LoadCredential", "StateDirectory", "StateDirectoryMode", "RuntimeDirectory",
		"RuntimeDirectoryMode", "RuntimeDirectoryPreserve", "CacheDirectory", "LogsDirectory",
		"ConfigurationDirectory", "UMask",
		"LimitCORE", "LimitNOFILE", "LimitNPROC", "LimitMEMLOCK", "LimitSTACK",
		"OOMScoreAdjust", "Nice", "CapabilityBoundingSet", "AmbientCapabilities", "NoNewPrivileges",
		"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateNetwork",
		"ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
		"ReadWritePaths", "ReadOnlyPaths", "RestrictAddressFamilies", "RestrictNamespaces",
		"LockPersonality", "SystemCallFilter", "SystemCallArchitectures",
		"StandardOutput", "StandardError", "SyslogIdentifier",
		// systemd.kill(5)
		"KillMode", "KillSignal", "SendSIGKILL",
		// systemd.resource-control(5)
		"Delegate", "Slice", "TasksMax", "MemoryMax", "MemoryHigh", "CPUQuota", "CPUWeight", "IOWeight",
	},
	"Install": {"WantedBy", "RequiredBy", "Alias", "Also"},
}

// systemdUnits are the units in deploy/systemd and what each must run.
var systemdUnits = []struct {
	file    string
	sub     string // agentenv subcommand
	envFile string // its EnvironmentFile, with an example next to the unit
	// adopts: sandboxes outlive the agent (KillMode=process), which
	// delegates cgroups and keeps its data in /var/lib/agentenv.
	adopts bool
}{
	{"agentenv-serve.service", "serve", "/etc/agentenv/serve.env", true},
	{"agentenv-node.service", "node", "/etc/agentenv/node.env", true},
	{"agentenv-api.service", "api", "/etc/agentenv/api.env", false},
}

// passedThrough are variables of an environment file that agentenv reads
// from its environment rather than from ExecStart.
var passedThrough = []string{"AGENTENV_API_KEY"}

// parseUnit parses a unit file and rejects sections and options not in
// systemdOptions.
func parseUnit(r io.Reader) ([]*unit.UnitSection, error) {
	sections, err := unit.DeserializeSections(r)
	if err != nil {
		return nil, err
	}
	if len(sections) == 0 {
		return nil, errors.New("no section")
	}
	for _, s := range sections {
		known, ok := systemdOptions[s.Section]
		if !ok {
			return nil, fmt.Errorf("unknown section [%s]", s.Section)
		}
		for _, e := range s.Entries {
			if !slices.Contains(known, e.Name) {
				return nil, fmt.Errorf("unknown option %s= in [%s]: check systemd's spelling and add it to systemdOptions", e.Name, s.Section)
			}
		}
	}
	return sections, nil
}

// values returns every value of an option.
func values(sections []*unit.UnitSection, section, name string) []string {
	var vs []string
	for _, s := range sections {
		if s.Section != section {
			continue
		}
		for _, e := range s.Entries {
			if e.Name == name {
				vs = append(vs, e.Value)
			}
		}
	}
	return vs
}

// value returns the one value of an option ("" when unset) and fails the
// test when the option is set twice.
func value(t *testing.T, sections []*unit.UnitSection, section, name string) string {
	t.Helper()
	vs := values(sections, section, name)
	switch len(vs) {
	case 0:
		return ""
	case 1:
		return vs[0]
	}
	t.Errorf("%s= is set %d times, want once", name, len(vs))
	return vs[0]
}

var (
	envLine     = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)
	envAltLine  = regexp.MustCompile(`^#([A-Z_][A-Z0-9_]*)=(.*)$`)
	wholeVarRef = regexp.MustCompile(`^\$([A-Za-z_][A-Za-z0-9_]*)$`)
	bracedRef   = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)
)

// envExample is an example environment file: its settings, and the
// commented-out "#KEY=VALUE" alternatives it suggests.
type envExample struct {
	values       map[string]string
	alternatives [][2]string
}

func parseEnvExample(r io.Reader) (envExample, error) {
	ex := envExample{values: map[string]string{}}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if m := envAltLine.FindStringSubmatch(line); m != nil {
			ex.alternatives = append(ex.alternatives, [2]string{m[1], m[2]})
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := envLine.FindStringSubmatch(line)
		if m == nil || strings.ContainsAny(m[2], `"'\`) {
			return ex, fmt.Errorf("line %d: %q is not KEY=VALUE without quotes", n, line)
		}
		if _, dup := ex.values[m[1]]; dup {
			return ex, fmt.Errorf("line %d: %s is set twice", n, m[1])
		}
		ex.values[m[1]] = m[2]
	}
	return ex, sc.Err()
}

// expandExecStart splits an ExecStart= value into words as systemd does
// for the subset used here (no quotes or escapes): a backslash ending a
// line joins it to the next, ${VAR} is replaced inside a word, a word $VAR
// becomes the value's words, %d is the unit's credentials directory. used
// collects the variables referenced.
func expandExecStart(cmdline, unitName string, env map[string]string, used map[string]bool) ([]string, error) {
	cmdline = strings.ReplaceAll(cmdline, "\\\n", " ")
	cmdline = strings.TrimLeft(cmdline, "-@:+!")
	if strings.ContainsAny(cmdline, `"'\`) {
		return nil, errors.New("quotes and escapes are not supported by this test")
	}
	var argv []string
	var err error
	lookup := func(name string) string {
		used[name] = true
		v, ok := env[name]
		if !ok && err == nil {
			err = fmt.Errorf("$%s is not set by Environment= or the environment file", name)
		}
		return v
	}
	for _, w := range strings.Fields(cmdline) {
		if m := wholeVarRef.FindStringSubmatch(w); m != nil {
			argv = append(argv, strings.Fields(lookup(m[1]))...)
			continue
		}
		w = bracedRef.ReplaceAllStringFunc(w, func(ref string) string { return lookup(bracedRef.FindStringSubmatch(ref)[1]) })
		w = strings.ReplaceAll(w, "%d", "/run/credentials/"+unitName)
		if strings.ContainsAny(w, "$%") {
			return nil, fmt.Errorf("word %q: use ${VAR} inside a word; %%d is the only specifier supported by this test", w)
		}
		argv = append(argv, w)
	}
	return argv, err
}

func TestSystemdUnits(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(systemdDir, "*.service"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(systemdUnits) {
		t.Errorf("found units %q, want the %d in systemdUnits", files, len(systemdUnits))
	}
	for _, u := range systemdUnits {
		t.Run(u.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join(systemdDir, u.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			sections, err := parseUnit(f)
			if err != nil {
				t.Fatal(err)
			}
			checkUnitSettings(t, sections, u.adopts)
			checkUnitCommand(t, sections, u.file, u.sub, u.envFile, u.adopts)
		})
	}
}

// checkUnitSettings checks the service settings every unit needs.
func checkUnitSettings(t *testing.T, sections []*unit.UnitSection, adopts bool) {
	t.Helper()
	if got := value(t, sections, "Service", "Restart"); got != "on-failure" {
		t.Errorf("Restart=%s, want on-failure", got)
	}
	if got := value(t, sections, "Service", "Type"); got != "" && got != "simple" && got != "exec" {
		t.Errorf("Type=%s: agentenv neither forks nor notifies", got)
	}
	if n, err := strconv.Atoi(value(t, sections, "Service", "LimitNOFILE")); err != nil || n < 65536 {
		t.Errorf("LimitNOFILE=%s, want at least 65536", value(t, sections, "Service", "LimitNOFILE"))
	}
	if !slices.Contains(values(sections, "Install", "WantedBy"), "multi-user.target") {
		t.Errorf("not WantedBy=multi-user.target")
	}
	kill := value(t, sections, "Service", "KillMode")
	if adopts {
		// The agent adopts its sandboxes at the next start: stopping it
		// must not kill them.
		if kill != "process" {
			t.Errorf("KillMode=%s, want process", kill)
		}
		for opt, want := range map[string]string{"Delegate": "yes", "StateDirectory": "agentenv", "TasksMax": "infinity"} {
			if got := value(t, sections, "Service", opt); got != want {
				t.Errorf("%s=%s, want %s", opt, got, want)
			}
		}
	} else if kill != "" && kill != "control-group" && kill != "mixed" {
		t.Errorf("KillMode=%s: a stateless server leaves nothing behind", kill)
	}
}

// checkUnitCommand checks ExecStart against the agentenv command table,
// with variables from Environment= and the example environment file, and
// again with each alternative the example suggests.
func checkUnitCommand(t *testing.T, sections []*unit.UnitSection, unitName, sub, envFile string, adopts bool) {
	t.Helper()
	env := map[string]string{}
	for _, v := range values(sections, "Service", "Environment") {
		for _, kv := range strings.Fields(v) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || strings.ContainsAny(kv, `"'\`) {
				t.Fatalf("Environment=%s: want KEY=VALUE words without quotes", v)
			}
			env[k] = v
		}
	}
	defaults := maps.Clone(env)
	ef := value(t, sections, "Service", "EnvironmentFile")
	optional := strings.HasPrefix(ef, "-")
	if strings.TrimPrefix(ef, "-") != envFile {
		t.Fatalf("EnvironmentFile=%s, want %s", ef, envFile)
	}
	exampleName := filepath.Base(envFile) + ".example"
	f, err := os.Open(filepath.Join(systemdDir, exampleName))
	if err != nil {
		t.Fatalf("environment file example: %v", err)
	}
	defer f.Close()
	ex, err := parseEnvExample(f)
	if err != nil {
		t.Fatalf("%s: %v", exampleName, err)
	}
	for k, v := range ex.values {
		env[k] = v
	}

	execs := values(sections, "Service", "ExecStart")
	if len(execs) != 1 {
		t.Fatalf("got %d ExecStart=, want 1", len(execs))
	}
	used := map[string]bool{}
	if optional {
		// Without the optional file the defaults alone must do.
		if _, err := expandExecStart(execs[0], unitName, defaults, used); err != nil {
			t.Errorf("EnvironmentFile is optional, but without it: %v", err)
		}
	}
	argv, err := expandExecStart(execs[0], unitName, env, used)
	if err != nil {
		t.Fatalf("ExecStart: %v", err)
	}
	if argv[0] != agentenvBin || len(argv) < 2 || argv[1] != sub {
		t.Fatalf("ExecStart runs %q, want %s %s", argv, agentenvBin, sub)
	}
	flags := checkCommandLine(t, argv[1:])
	for k := range ex.values {
		if !used[k] && !slices.Contains(passedThrough, k) {
			t.Errorf("%s sets %s, which ExecStart does not use", exampleName, k)
		}
	}
	for _, alt := range ex.alternatives {
		if !used[alt[0]] {
			continue
		}
		altEnv := maps.Clone(env)
		altEnv[alt[0]] = alt[1]
		argv, err := expandExecStart(execs[0], unitName, altEnv, map[string]bool{})
		if err != nil {
			t.Errorf("%s with %s=%s: %v", exampleName, alt[0], alt[1], err)
			continue
		}
		checkCommandLine(t, argv[1:])
	}
	if flags == nil {
		return
	}
	if adopts && flags["data-dir"] != dataDir {
		t.Errorf("--data-dir %s, want %s (StateDirectory=agentenv)", flags["data-dir"], dataDir)
	}
	checkDeliveredFiles(t, sections, unitName, flags)
}

// checkDeliveredFiles checks the files the command reads (secrets, keys,
// certificates): each comes from /etc/agentenv, directly or through
// LoadCredential= (the only way for a DynamicUser= service, which cannot
// read root's files), and the unit refuses to start without it. The
// cluster secret is the same file on every host.
func checkDeliveredFiles(t *testing.T, sections []*unit.UnitSection, unitName string, flags map[string]string) {
	t.Helper()
	dynamic := value(t, sections, "Service", "DynamicUser") == "yes"
	credentials := map[string]string{}
	for _, lc := range values(sections, "Service", "LoadCredential") {
		id, source, ok := strings.Cut(lc, ":")
		if !ok {
			t.Errorf("LoadCredential=%s: want ID:PATH", lc)
		}
		if _, dup := credentials[id]; dup {
			t.Errorf("LoadCredential= loads %s twice", id)
		}
		credentials[id] = source
	}
	asserted := values(sections, "Unit", "AssertPathExists")
	sources := map[string]string{}
	for _, name := range fileFlags {
		file, ok := flags[name]
		if !ok {
			continue
		}
		source := file
		if id, ok := strings.CutPrefix(file, "/run/credentials/"+unitName+"/"); ok {
			if source, ok = credentials[id]; !ok {
				t.Errorf("--%s %s: no LoadCredential=%s:PATH", name, file, id)
				continue
			}
		} else if dynamic {
			t.Errorf("--%s %s: a DynamicUser= service reads root's files only as credentials (LoadCredential=, %%d/ID)", name, file)
		}
		if dir, _ := filepath.Split(source); filepath.Clean(dir) != configDir {
			t.Errorf("--%s: %s is not a file in %s", name, source, configDir)
		}
		if name == "cluster-secret-file" && source != clusterSecret {
			t.Errorf("--cluster-secret-file %s: want %s, directly or through LoadCredential=", file, clusterSecret)
		}
		if other, dup := sources[source]; dup {
			t.Errorf("--%s and --%s both read %s", name, other, source)
		}
		sources[source] = name
		if !slices.Contains(asserted, source) {
			t.Errorf("--%s: no AssertPathExists=%s: a missing file should stop the start with a clear message", name, source)
		}
	}
	for id, source := range credentials {
		if _, used := sources[source]; !used {
			t.Errorf("LoadCredential=%s:%s: no flag reads that credential", id, source)
		}
	}
}

// TestSystemdOptionsExist checks systemdOptions against the options the
// local systemd knows, so the list itself holds no misspelling.
func TestSystemdOptionsExist(t *testing.T) {
	const systemd = "/lib/systemd/systemd"
	if _, err := os.Stat(systemd); err != nil {
		t.Skipf("no %s to list the options it knows: %v", systemd, err)
	}
	out, err := exec.Command(systemd, "--dump-configuration-items").Output()
	if err != nil {
		t.Fatalf("%s --dump-configuration-items: %v", systemd, err)
	}
	known := map[string]bool{}
	section := ""
	for line := range strings.Lines(string(out)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			section = strings.Trim(line, "[]")
		} else if name, _, ok := strings.Cut(line, "="); ok {
			known[section+"."+name] = true
		}
	}
	for section, names := range systemdOptions {
		for _, name := range names {
			if !known[section+"."+name] {
				t.Errorf("systemd does not know %s= in [%s]", name, section)
			}
		}
	}
}
