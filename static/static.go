// Package static embeds the browser client: the esbuild bundle of the
// TypeScript sources in src/ and the stylesheet, built into dist/ by
// `npm run build` and committed. Files are served under a content hash, so
// a new build is never mixed with a cached old one.
package static

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"sort"
	"strings"
)

//go:embed dist
var embedded embed.FS

var (
	dist, _ = fs.Sub(embedded, "dist")
	version = contentHash(dist)
)

// contentHash names the build: the first 12 hex digits of the SHA-256 of
// every file's name and content.
func contentHash(fsys fs.FS) string {
	var names []string
	_ = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, p)
		}
		return nil
	})
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, _ := fs.ReadFile(fsys, n)
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// Path is the URL of a built file, e.g. Path("app.js").
func Path(name string) string { return "/static/" + version + "/" + name }

// Handler serves GET /static/{version}/{file}: immutable for a year, since
// the version changes with any content. Another version is not found.
func Handler() http.Handler {
	files := http.FileServerFS(dist)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/static/"+version+"/")
		if !ok || rest == "" || strings.Contains(rest, "..") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + path.Clean(rest)
		files.ServeHTTP(w, r2)
	})
}
