package runtime_test

import (
	"bytes"
	"testing"

	"github.com/agentenv/agentenv/internal/runtime"
)

func TestTail(t *testing.T) {
	var all bytes.Buffer
	tail := runtime.NewTail(10)
	for i, chunk := range []string{"abc", "defghijklmno", "p", "", "qrstuvwxyz0123456789ABCDEFG", "H", "IJ"} {
		n, err := tail.Write([]byte(chunk))
		if n != len(chunk) || err != nil {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
		all.WriteString(chunk)
		want := all.Bytes()[max(0, all.Len()-10):]
		if got := tail.Bytes(); !bytes.Equal(got, want) {
			t.Errorf("after write %d: %q, want %q", i, got, want)
		}
	}
}
