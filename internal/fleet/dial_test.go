package fleet

import (
	"strings"
	"testing"
)

func TestDialRefusesUnauthenticatedEtcd(t *testing.T) {
	for _, c := range []struct {
		urls string
		auth EtcdAuth
		want string
	}{
		{"http://10.0.0.1:2379", EtcdAuth{}, "https://"},
		{"http://10.0.0.1:2379", EtcdAuth{Cert: "c", Key: "k"}, "https://"},
		{"https://10.0.0.1:2379", EtcdAuth{}, "authentication"},
		{"https://10.0.0.1:2379", EtcdAuth{Cert: "c"}, "go together"},
		{"", EtcdAuth{}, "give the etcd"},
	} {
		_, err := Dial(c.urls, c.auth)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Dial(%q, %+v) = %v, want an error saying %q", c.urls, c.auth, err, c.want)
		}
	}
	cli, err := Dial("http://127.0.0.1:1", EtcdAuth{})
	if err != nil {
		t.Fatalf("loopback etcd without authentication (a trial on one host): %v", err)
	}
	cli.Close()
}

// With a CA configured, a node that registered without TLS is never
// called over plain HTTP, whatever its record says.
