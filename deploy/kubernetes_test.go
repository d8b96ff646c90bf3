package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const (
	kubeDir       = "kubernetes"
	secretExample = "secrets.example.yaml"
	image         = "agentenv:latest"
	dataDir       = "/var/lib/agentenv"
)

// kinds are the Kubernetes objects the manifests may hold, each decoded
// into its real type from k8s.io/api.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"Namespace":  {"v1", func() any { return new(corev1.Namespace) }},
	"ConfigMap":  {"v1", func() any { return new(corev1.ConfigMap) }},
	"Secret":     {"v1", func() any { return new(corev1.Secret) }},
	"Service":    {"v1", func() any { return new(corev1.Service) }},
	"DaemonSet":  {"apps/v1", func() any { return new(appsv1.DaemonSet) }},
	"Deployment": {"apps/v1", func() any { return new(appsv1.Deployment) }},
}

// decodeManifests strictly decodes every YAML document in data: unknown or
// duplicate fields and values of the wrong type are errors.
func decodeManifests(data []byte) ([]any, error) {
	var objs []any
	for i, doc := range splitDocuments(data) {
		var head metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		k, ok := kinds[head.Kind]
		if !ok {
			return nil, fmt.Errorf("document %d: unknown kind %q: add it to kinds", i+1, head.Kind)
		}
		if head.APIVersion != k.apiVersion {
			return nil, fmt.Errorf("document %d: %s has apiVersion %q, want %q", i+1, head.Kind, head.APIVersion, k.apiVersion)
		}
		obj := k.new()
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i+1, head.Kind, err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// splitDocuments splits a YAML stream at its "---" lines, dropping
// documents that hold only comments.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		for line := range strings.Lines(cur.String()) {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				docs = append(docs, bytes.Clone(cur.Bytes()))
				break
			}
		}
		cur.Reset()
	}
	for line := range strings.Lines(string(data)) {
		if strings.TrimRight(line, " \t\r\n") == "---" {
			flush()
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return docs
}

// kustomization is the part of kustomize's Kustomization type
// (sigs.k8s.io/kustomize/api/types, whose module is too large to pull in
// for a test) that deploy/kubernetes uses, with kustomize's field names.
// Strict decoding rejects every other field: add one here, spelt as in
// kustomize, before using it.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources,omitempty"`
	// Images is what `kustomize edit set image` writes.
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

func decodeKustomization(data []byte) (kustomization, error) {
	var k kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		return k, err
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return k, fmt.Errorf("got %s %s, want kustomize.config.k8s.io/v1beta1 Kustomization", k.APIVersion, k.Kind)
	}
	return k, nil
}

// cluster is every object in deploy/kubernetes, by file and by kind.
type cluster struct {
	files       map[string][]any
	namespaces  []*corev1.Namespace
	configMaps  []*corev1.ConfigMap
	secrets     []*corev1.Secret
	services    []*corev1.Service
	daemonSets  []*appsv1.DaemonSet
	deployments []*appsv1.Deployment
}

// loadCluster decodes every manifest (every .yaml file but the
// kustomization) and fails the test on the first that does not decode.
func loadCluster(t *testing.T) *cluster {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(kubeDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{files: map[string][]any{}}
	for _, p := range paths {
		name := filepath.Base(p)
		if name == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeManifests(data)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if len(objs) == 0 {
			t.Fatalf("%s holds no object", p)
		}
		c.files[name] = objs
		for _, o := range objs {
			switch o := o.(type) {
			case *corev1.Namespace:
				c.namespaces = append(c.namespaces, o)
			case *corev1.ConfigMap:
				c.configMaps = append(c.configMaps, o)
			case *corev1.Secret:
				c.secrets = append(c.secrets, o)
			case *corev1.Service:
				c.services = append(c.services, o)
			case *appsv1.DaemonSet:
				c.daemonSets = append(c.daemonSets, o)
			case *appsv1.Deployment:
				c.deployments = append(c.deployments, o)
			}
		}
	}
	if len(c.files) < 5 {
		t.Fatalf("found %d manifests in %s, want at least 5: is the test running in deploy/?", len(c.files), kubeDir)
	}
	return c
}

func (c *cluster) configMapValue(name, key string) (string, error) {
	for _, cm := range c.configMaps {
		if cm.Name == name {
			if v, ok := cm.Data[key]; ok {
				return v, nil
			}
			return "", fmt.Errorf("ConfigMap %s has no key %q", name, key)
		}
	}
	return "", fmt.Errorf("no ConfigMap %s in %s", name, kubeDir)
}

func TestKubernetesObjectsShareNamespaceAndNames(t *testing.T) {
	c := loadCluster(t)
	if len(c.namespaces) != 1 {
		t.Fatalf("got %d Namespaces, want 1", len(c.namespaces))
	}
	ns := c.namespaces[0].Name
	seen := map[string]string{}
	for file, objs := range c.files {
		for _, o := range objs {
			meta := o.(metav1.Object)
			kind := strings.TrimPrefix(fmt.Sprintf("%T", o), "*")
			if _, isNS := o.(*corev1.Namespace); !isNS && meta.GetNamespace() != ns {
				t.Errorf("%s: %s %s is in namespace %q, want %q", file, kind, meta.GetName(), meta.GetNamespace(), ns)
			}
			if _, isSecret := o.(*corev1.Secret); isSecret && file != secretExample {
				t.Errorf("%s: Secret %s belongs in %s: secrets are made by hand, not applied from the kustomization", file, meta.GetName(), secretExample)
			}
			id := kind + "/" + meta.GetName()
			if prev, dup := seen[id]; dup {
				t.Errorf("%s: %s %s is also in %s", file, kind, meta.GetName(), prev)
			}
			seen[id] = file
		}
	}
}

func TestKustomizationListsEveryManifest(t *testing.T) {
	c := loadCluster(t)
	data, err := os.ReadFile(filepath.Join(kubeDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := decodeKustomization(data)
	if err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.Namespace != c.namespaces[0].Name {
		t.Errorf("kustomization namespace is %q, want %q", k.Namespace, c.namespaces[0].Name)
	}
	for i, r := range k.Resources {
		if slices.Contains(k.Resources[:i], r) {
			t.Errorf("kustomization lists %s twice", r)
		}
		if _, ok := c.files[r]; !ok {
			t.Errorf("kustomization lists %s, which is not a manifest in %s", r, kubeDir)
		}
	}
	for file := range c.files {
		listed := slices.Contains(k.Resources, file)
		if file == secretExample && listed {
			t.Errorf("kustomization lists %s: its placeholder secrets must not be applied", file)
		}
		if file != secretExample && !listed {
			t.Errorf("kustomization does not list %s", file)
		}
	}
}

// fieldExamples stand in for the downward API's values.
var fieldExamples = map[string]string{
	"spec.nodeName": "k8s-node-1",
	"status.hostIP": "192.0.2.11",
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// podCommandLine checks the agentenv container of a workload and returns
// its flags, with $(VAR) references filled in from the container's env:
// config map and secret values from the manifests, downward API fields
// from fieldExamples.
func podCommandLine(t *testing.T, c *cluster, sub string, selector *metav1.LabelSelector, tmpl corev1.PodTemplateSpec) (*corev1.Container, map[string]string) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(tmpl.Labels)) {
		t.Errorf("selector %v (%v) does not select the pod template's labels %v", selector, err, tmpl.Labels)
	}
	spec := tmpl.Spec
	if len(spec.Containers) != 1 || spec.Containers[0].Name != "agentenv" {
		t.Fatalf("want one container named agentenv, got %d", len(spec.Containers))
	}
	ctr := &spec.Containers[0]
	if ctr.Image != image || len(ctr.Command) != 0 {
		t.Errorf("container runs %q %q, want image %s with its entrypoint", ctr.Image, ctr.Command, image)
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		v, err := envValue(c, e)
		if err != nil {
			t.Errorf("env %s: %v", e.Name, err)
		}
		env[e.Name] = v
	}
	args := make([]string, len(ctr.Args))
	for i, a := range ctr.Args {
		args[i] = varRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			v, ok := env[name]
			if !ok {
				t.Errorf("argument %q refers to $(%s), which the container's env does not define", a, name)
			}
			return v
		})
	}
	if len(args) == 0 || args[0] != sub {
		t.Fatalf("args %q: want agentenv %s", ctr.Args, sub)
	}
	flags := checkCommandLine(t, args)
	if flags == nil {
		t.FailNow()
	}
	checkVolumes(t, c, spec, ctr)
	checkPodFiles(t, c, sub, spec, ctr, flags)
	for _, name := range []string{"listen", "proxy-listen"} {
		if v, ok := flags[name]; ok && containerPort(ctr, portOf(t, v)) == nil {
			t.Errorf("--%s %s: the container declares no port %d", name, v, portOf(t, v))
		}
	}
	// Both roles answer GET /health on --listen without credentials.
	// A node with --tls-cert serves HTTPS only; the API server serves
	// plain HTTP (TLS ends at the load balancer).
	scheme := corev1.URISchemeHTTP
	if sub == "node" && flags["tls-cert"] != "" {
		scheme = corev1.URISchemeHTTPS
	}
	probe := ctr.ReadinessProbe
	if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != "/health" {
		t.Errorf("readiness probe %+v, want GET /health", probe)
	} else if got := probe.HTTPGet.Scheme; got != scheme && (got != "" || scheme != corev1.URISchemeHTTP) {
		t.Errorf("readiness probe scheme %q, want %s", got, scheme)
	} else if p := probe.HTTPGet.Port; (p.IntVal != 0 && p.IntVal != portOf(t, flags["listen"])) ||
		(p.StrVal != "" && !slices.ContainsFunc(ctr.Ports, func(cp corev1.ContainerPort) bool {
			return cp.Name == p.StrVal && cp.ContainerPort == portOf(t, flags["listen"])
		})) {
		t.Errorf("readiness probe port %s is not the --listen port %s", p.String(), flags["listen"])
	}
	return ctr, flags
}

func envValue(c *cluster, e corev1.EnvVar) (string, error) {
	from := e.ValueFrom
	switch {
	case from == nil:
		return e.Value, nil
	case from.FieldRef != nil:
		v, ok := fieldExamples[from.FieldRef.FieldPath]
		if !ok {
			return "", fmt.Errorf("field %s has no example value in fieldExamples", from.FieldRef.FieldPath)
		}
		return v, nil
	case from.ConfigMapKeyRef != nil:
		return c.configMapValue(from.ConfigMapKeyRef.Name, from.ConfigMapKeyRef.Key)
	case from.SecretKeyRef != nil:
		return c.secretValue(from.SecretKeyRef.Name, from.SecretKeyRef.Key)
	}
	return "", errors.New("unsupported valueFrom")
}

// checkVolumes checks that every mount names a volume and every secret
// volume names a secret and keys that secrets.example.yaml has.
func checkVolumes(t *testing.T, c *cluster, spec corev1.PodSpec, ctr *corev1.Container) {
	t.Helper()
	for _, m := range ctr.VolumeMounts {
		if volume(spec, m.Name) == nil {
			t.Errorf("volume mount %s names no volume", m.Name)
		}
	}
	for _, v := range spec.Volumes {
		if v.Secret == nil {
			continue
		}
		if _, err := c.secret(v.Secret.SecretName); err != nil {
			t.Errorf("volume %s: %v", v.Name, err)
		}
		for _, it := range v.Secret.Items {
			if _, err := c.secretValue(v.Secret.SecretName, it.Key); err != nil {
				t.Errorf("volume %s: %v", v.Name, err)
			}
		}
	}
}

func volume(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// mountedAt returns the volume mounted at p (or at a parent of it) and p's
// path inside that volume.
func mountedAt(spec corev1.PodSpec, ctr *corev1.Container, p string) (*corev1.Volume, string) {
	var best *corev1.VolumeMount
	for i, m := range ctr.VolumeMounts {
		if (p == m.MountPath || strings.HasPrefix(p, m.MountPath+"/")) && (best == nil || len(m.MountPath) > len(best.MountPath)) {
			best = &ctr.VolumeMounts[i]
		}
	}
	if best == nil {
		return nil, ""
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(p, best.MountPath), "/")
	return volume(spec, best.Name), path.Join(best.SubPath, rel)
}

func containerPort(ctr *corev1.Container, port int32) *corev1.ContainerPort {
	for i, p := range ctr.Ports {
		if p.ContainerPort == port {
			return &ctr.Ports[i]
		}
	}
	return nil
}

func TestNodeDaemonSet(t *testing.T) {
	c := loadCluster(t)
	if len(c.daemonSets) != 1 {
		t.Fatalf("got %d DaemonSets, want 1", len(c.daemonSets))
	}
	ds := c.daemonSets[0]
	spec := ds.Spec.Template.Spec
	ctr, flags := podCommandLine(t, c, "node", ds.Spec.Selector, ds.Spec.Template)

	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %q: want the host's network with cluster DNS (ClusterFirstWithHostNet)", spec.HostNetwork, spec.DNSPolicy)
	}
	if sc := ctr.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Errorf("container is not privileged: the node creates namespaces, veths, nftables rules and cgroups")
	}
	if got, want := flags["name"], fieldExamples["spec.nodeName"]; got != want {
		t.Errorf("--name is %q, want the node's name from spec.nodeName", got)
	}
	if host, _, _ := net.SplitHostPort(flags["advertise"]); host != fieldExamples["status.hostIP"] {
		t.Errorf("--advertise is %q, want status.hostIP:PORT", flags["advertise"])
	}
	if portOf(t, flags["advertise"]) != portOf(t, flags["listen"]) {
		t.Errorf("--advertise %s and --listen %s: want the same port (host network)", flags["advertise"], flags["listen"])
	}
	if p := containerPort(ctr, portOf(t, flags["listen"])); p == nil || p.HostPort != p.ContainerPort {
		t.Errorf("port %s: want a container port with the same hostPort", flags["listen"])
	}
	if flags["data-dir"] != dataDir {
		t.Errorf("--data-dir is %q, want %s", flags["data-dir"], dataDir)
	}

	bidi := corev1.MountPropagationBidirectional
	for _, want := range []struct {
		mountPath, hostPath string
		propagation         *corev1.MountPropagationMode
	}{
		{dataDir, dataDir, &bidi},
		{"/run/netns", "/run/netns", &bidi},
		{"/sys/fs/cgroup", "/sys/fs/cgroup", nil},
		{"/dev", "/dev", nil},
	} {
		i := slices.IndexFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == want.mountPath })
		if i < 0 {
			t.Errorf("nothing is mounted at %s", want.mountPath)
			continue
		}
		m := ctr.VolumeMounts[i]
		if v := volume(spec, m.Name); v == nil || v.HostPath == nil || v.HostPath.Path != want.hostPath {
			t.Errorf("%s: want host path %s", want.mountPath, want.hostPath)
		}
		if got := m.MountPropagation; (got == nil) != (want.propagation == nil) || (got != nil && *got != *want.propagation) {
			t.Errorf("%s: mount propagation %v, want %v", want.mountPath, deref(got), deref(want.propagation))
		}
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return "none"
	}
	return *p
}

func TestAPIDeployment(t *testing.T) {
	c := loadCluster(t)
	if len(c.deployments) != 1 {
		t.Fatalf("got %d Deployments, want 1", len(c.deployments))
	}
	d := c.deployments[0]
	spec := d.Spec.Template.Spec
	ctr, flags := podCommandLine(t, c, "api", d.Spec.Selector, d.Spec.Template)

	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("replicas %v, want at least 2", deref(d.Spec.Replicas))
	}
	i := slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "AGENTENV_API_KEY" })
	if i < 0 || ctr.Env[i].ValueFrom == nil || ctr.Env[i].ValueFrom.SecretKeyRef == nil ||
		ctr.Env[i].ValueFrom.SecretKeyRef.Name != "agentenv-api" || ctr.Env[i].ValueFrom.SecretKeyRef.Key != "api-key" {
		t.Errorf("AGENTENV_API_KEY does not come from key api-key of Secret agentenv-api")
	}
	// A non-root server must still be able to read the mounted secrets.
	if sc := spec.SecurityContext; sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot {
		for _, name := range fileFlags {
			file, ok := flags[name]
			if !ok {
				continue
			}
			vol, _ := mountedAt(spec, ctr, file)
			if sc.FSGroup == nil || vol == nil || vol.Secret == nil || vol.Secret.DefaultMode == nil || *vol.Secret.DefaultMode&0o040 == 0 {
				t.Errorf("runs as non-root, but --%s %s is not group-readable by an fsGroup", name, file)
			}
		}
	}
}

func TestServicesTargetContainerPorts(t *testing.T) {
	c := loadCluster(t)
	if len(c.services) == 0 {
		t.Fatal("no Service")
	}
	for _, svc := range c.services {
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		var pods []corev1.PodTemplateSpec
		for _, d := range c.deployments {
			if !sel.Empty() && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				pods = append(pods, d.Spec.Template)
			}
		}
		if len(pods) != 1 {
			t.Errorf("Service %s selects %d Deployments, want 1", svc.Name, len(pods))
			continue
		}
		ctr := &pods[0].Spec.Containers[0]
		for _, sp := range svc.Spec.Ports {
			tp := sp.TargetPort
			i := slices.IndexFunc(ctr.Ports, func(cp corev1.ContainerPort) bool {
				switch {
				case tp.StrVal != "":
					return cp.Name == tp.StrVal
				case tp.IntVal != 0:
					return cp.ContainerPort == tp.IntVal
				}
				return cp.ContainerPort == sp.Port
			})
			if i < 0 {
				t.Errorf("Service %s port %s: targetPort %s is no container port", svc.Name, sp.Name, tp.String())
			} else if ctr.Ports[i].Protocol != sp.Protocol {
				t.Errorf("Service %s port %s: protocol %s, container port %s", svc.Name, sp.Name, sp.Protocol, ctr.Ports[i].Protocol)
			}
		}
		for _, cp := range ctr.Ports {
			if !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool {
				return sp.TargetPort.StrVal == cp.Name || sp.TargetPort.IntVal == cp.ContainerPort
			}) {
				t.Errorf("Service %s does not expose container port %s (%d)", svc.Name, cp.Name, cp.ContainerPort)
			}
		}
	}
}
