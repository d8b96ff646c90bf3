package node

import (
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/agentenv/agentenv/internal/snapshot"
)

// Snapshot chunks are sparse: the pages a snapshot shares with its parent
// are holes. On the wire between nodes, runs of zero pages travel as a
// length, not as zeros, when both ends speak the sparse encoding
// (snapshot.WriteSparse; sparseHeader on the request and on the answer).
// Offsets are those of the file, so a broken transfer resumes with a
// Range request as a plain one does.

const sparseHeader = "X-Agentenv-Sparse"

// serveSparse answers a request that asked for the sparse encoding: the
// file from the Range's start ("bytes=N-", the only form copies send).
func serveSparse(w http.ResponseWriter, r *http.Request, f *os.File) {
	var off int64
	if rg := r.Header.Get("Range"); rg != "" {
		s, ok := strings.CutPrefix(rg, "bytes=")
		s, ok2 := strings.CutSuffix(s, "-")
		n, err := strconv.ParseInt(s, 10, 64)
		if !ok || !ok2 || err != nil || n < 0 {
			http.Error(w, "sparse copies take a Range of the form bytes=N-", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		off = n
	}
	w.Header().Set(sparseHeader, "1")
	w.Header().Set("Content-Type", "application/octet-stream")
	if off > 0 {
		w.WriteHeader(http.StatusPartialContent)
	}
	snapshot.WriteSparse(w, f, off) // a failure shows as a cut stream: the copy resumes
}
