// Package deploy holds only deployment files (systemd units, Kubernetes
// manifests, a Dockerfile) and the test that decodes them strictly and
// checks them against each other and against agentenv's commands. It has
// no code: nothing may import it.
package deploy
