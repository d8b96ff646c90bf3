package deploy

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The Secrets of deploy/kubernetes: what secrets.example.yaml tells the
// operator to make, and how each role's secret files get into its pod.

// secret returns a Secret of secrets.example.yaml, the secrets a
// deployment is told to create.
func (c *cluster) secret(name string) (*corev1.Secret, error) {
	for _, o := range c.files[secretExample] {
		if s, ok := o.(*corev1.Secret); ok && s.Name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no Secret %s in %s", name, secretExample)
}

func (c *cluster) secretValue(name, key string) (string, error) {
	s, err := c.secret(name)
	if err != nil {
		return "", err
	}
	if v, ok := s.StringData[key]; ok {
		return v, nil
	}
	if v, ok := s.Data[key]; ok {
		return string(v), nil
	}
	return "", fmt.Errorf("Secret %s in %s has no key %q", name, secretExample, key)
}

// TestSecretsExample checks the example secrets against what Kubernetes
// and agentenv accept: certificate Secrets have the keys of their type,
// and the keys are long enough and the operator's differs from the API
// key (the API server refuses to start otherwise).
func TestSecretsExample(t *testing.T) {
	c := loadCluster(t)
	for _, o := range c.files[secretExample] {
		s := o.(*corev1.Secret)
		if s.Type != corev1.SecretTypeTLS {
			continue
		}
		for _, key := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
			if _, err := c.secretValue(s.Name, key); err != nil {
				t.Errorf("%v: a %s Secret needs it", err, s.Type)
			}
		}
	}
	values := map[string]string{}
	for _, k := range []secretKey{{"agentenv-cluster", "secret"}, {"agentenv-api", "api-key"}, {"agentenv-operator", "operator-key"}} {
		v, err := c.secretValue(k.secret, k.key)
		if err != nil {
			t.Error(err)
			continue
		}
		if len(v) < 16 {
			t.Errorf("Secret %s key %s is %d characters, want at least 16", k.secret, k.key, len(v))
		}
		values[k.key] = v
	}
	if values["operator-key"] == values["api-key"] {
		t.Errorf("the example operator key is the API key: agentenv api refuses that")
	}
}

// secretKey names a key of a Secret in secrets.example.yaml.
type secretKey struct{ secret, key string }

// podFiles are where each role's file flags must come from: a key of a
// Secret, mounted read-only. Each role has its own certificate; both
// verify the other with the fleet's CA.
var podFiles = map[string]map[string]secretKey{
	"node": {
		"cluster-secret-file": {"agentenv-cluster", "secret"},
		"etcd-ca":             {"agentenv-etcd-client", "ca.crt"},
		"etcd-cert":           {"agentenv-etcd-client", "tls.crt"},
		"etcd-key":            {"agentenv-etcd-client", "tls.key"},
		"tls-ca":              {"agentenv-node-tls", "ca.crt"},
		"tls-cert":            {"agentenv-node-tls", "tls.crt"},
		"tls-key":             {"agentenv-node-tls", "tls.key"},
	},
	"api": {
		"cluster-secret-file": {"agentenv-cluster", "secret"},
		"operator-key-file":   {"agentenv-operator", "operator-key"},
		"etcd-ca":             {"agentenv-etcd-client", "ca.crt"},
		"etcd-cert":           {"agentenv-etcd-client", "tls.crt"},
		"etcd-key":            {"agentenv-etcd-client", "tls.key"},
		"tls-ca":              {"agentenv-api-tls", "ca.crt"},
		"tls-cert":            {"agentenv-api-tls", "tls.crt"},
		"tls-key":             {"agentenv-api-tls", "tls.key"},
	},
}

// checkPodFiles checks that every file flag of a role reads the key of
// the Secret podFiles names, from a read-only mount of that Secret (so
// the pod does not start without it), and that the role's Secrets are
// ones secrets.example.yaml tells the operator to make.
func checkPodFiles(t *testing.T, c *cluster, sub string, spec corev1.PodSpec, ctr *corev1.Container, flags map[string]string) {
	t.Helper()
	for _, name := range fileFlags {
		file, ok := flags[name]
		if !ok {
			continue
		}
		want, ok := podFiles[sub][name]
		if !ok {
			t.Errorf("--%s: podFiles does not say which Secret delivers it to %s", name, sub)
			continue
		}
		vol, rel := mountedAt(spec, ctr, file)
		if vol == nil || vol.Secret == nil || vol.Secret.SecretName != want.secret || secretItemKey(vol.Secret, rel) != want.key {
			t.Errorf("--%s %s is not key %q of Secret %s mounted in the container", name, file, want.key, want.secret)
			continue
		}
		if vol.Secret.Optional != nil && *vol.Secret.Optional {
			t.Errorf("--%s: volume %s is optional: the pod would start without the file", name, vol.Name)
		}
		if i := slices.IndexFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == vol.Name }); i < 0 || !ctr.VolumeMounts[i].ReadOnly {
			t.Errorf("--%s: volume %s is not mounted read-only", name, vol.Name)
		}
		if _, err := c.secretValue(want.secret, want.key); err != nil {
			t.Errorf("--%s: %v", name, err)
		}
	}
}

// secretItemKey returns the secret key a secret volume shows at file.
func secretItemKey(s *corev1.SecretVolumeSource, file string) string {
	if len(s.Items) == 0 {
		return file
	}
	for _, it := range s.Items {
		if it.Path == file {
			return it.Key
		}
	}
	return ""
}
