package runscbuild

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
)

// WriteProxy lays out a GOPROXY=file:// directory at dir that serves one
// version of module: its .info (given), its go.mod and a zip of the tree at
// src, which must hold only the module's files (a module cache copy does).
// It returns the tree's h1: sum, the one go records for the module.
func WriteProxy(dir, module, version string, info []byte, src string) (string, error) {
	esc, err := escapePath(module)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(dir, filepath.FromSlash(esc), "@v")
	if err := os.RemoveAll(vdir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	gomod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		return "", err
	}
	files, err := moduleFiles(src)
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{"list": []byte(version + "\n"), version + ".info": info, version + ".mod": gomod} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	prefix := module + "@" + version + "/"
	if err := writeZip(filepath.Join(vdir, version+".zip"), src, prefix, files); err != nil {
		return "", err
	}
	return hash1(src, prefix, files)
}

// moduleFiles lists the regular files under src, slash-separated, sorted.
func moduleFiles(src string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", p)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	sort.Strings(files)
	return files, err
}

func writeZip(name, src, prefix string, files []string) error {
	return atomicfile.Write(name, 0o644, func(f io.Writer) error {
		zw := zip.NewWriter(f)
		for _, rel := range files {
			w, err := zw.CreateHeader(&zip.FileHeader{Name: prefix + rel, Method: zip.Deflate})
			if err != nil {
				return err
			}
			if err := copyInto(w, filepath.Join(src, filepath.FromSlash(rel))); err != nil {
				return err
			}
		}
		return zw.Close()
	})
}

func copyInto(w io.Writer, file string) error {
	r, err := os.Open(file)
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = io.Copy(w, r)
	return err
}

// hash1 is the go command's "h1:" module hash: SHA-256 over the lines
// "<sha256 hex>  <prefix+name>\n" of every file, sorted by name.
func hash1(src, prefix string, files []string) (string, error) {
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = prefix + f
	}
	sort.Strings(names)
	summary := sha256.New()
	for _, name := range names {
		h := sha256.New()
		if err := copyInto(h, filepath.Join(src, filepath.FromSlash(strings.TrimPrefix(name, prefix)))); err != nil {
			return "", err
		}
		fmt.Fprintf(summary, "%x  %s\n", h.Sum(nil), name)
	}
	return "h1:" + base64.StdEncoding.EncodeToString(summary.Sum(nil)), nil
}

// escapePath is the module proxy's case encoding: each upper-case letter
// becomes '!' and its lower case.
func escapePath(module string) (string, error) {
	var b strings.Builder
	for _, r := range module {
		switch {
		case r >= 'A' && r <= 'Z':
			b.WriteByte('!')
			b.WriteRune(r + 'a' - 'A')
		case r == '!' || r > 0x7e || r < 0x21:
			return "", fmt.Errorf("module path %q: character %q", module, r)
		default:
			b.WriteRune(r)
		}
	}
	if path.Clean(b.String()) != b.String() {
		return "", fmt.Errorf("module path %q is not clean", module)
	}
	return b.String(), nil
}
