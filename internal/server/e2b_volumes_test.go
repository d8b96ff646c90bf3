package server_test

import "testing"

// TestE2BVolumes runs tests/e2b/volumes.test.mjs: the official e2b SDK's
// Volume class (control plane and content API) against the server.
func TestE2BVolumes(t *testing.T) { runSDKTest(t, sharedServer(t), "volumes.test.mjs") }
