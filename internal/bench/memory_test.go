package bench

import (
	"testing"
)

func TestSummarizeMemory(t *testing.T) {
	tests := []struct {
		name string
		per  []pss
		want Memory
	}{
		{"none", nil, Memory{}},
		{"one", []pss{{Total: 10240, Anon: 5120, File: 4096, Shmem: 1024}},
			Memory{Sandboxes: 1, PssMiB: 10, MinMiB: 10, MaxMiB: 10, AnonMiB: 5, FileMiB: 4, ShmemMiB: 1}},
		{"mean, min and max", []pss{{Total: 1024, Anon: 1024}, {Total: 3072, File: 2048, Shmem: 1024}, {Total: 2048, Anon: 2048}},
			Memory{Sandboxes: 3, PssMiB: 2, MinMiB: 1, MaxMiB: 3, AnonMiB: 1, FileMiB: 2.0 / 3, ShmemMiB: 1.0 / 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := summarizeMemory(tt.per); got != tt.want {
				t.Errorf("summarizeMemory = %+v, want %+v", got, tt.want)
			}
		})
	}
}
