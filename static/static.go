// Package static embeds the browser client: the esbuild bundle of the
// TypeScript sources in src/ and the stylesheet, built into dist/ by
// `npm run build` and committed with their brotli and gzip copies
// (compress.mjs). Files are served under a content hash, so a new build is
// never mixed with a cached old one.
package static

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
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

// codings are the content codings a built file may be precompressed in,
// most preferred first, each with the suffix of its copy in dist:
// brotli is smaller than gzip by a sixth on the bundle.
var codings = []struct{ name, suffix string }{{"br", ".br"}, {"gzip", ".gz"}}

// variants maps each servable file in dist to the copies of it that
// `npm run build` precompressed (static/compress.mjs): coding name -> file
// name. The copies themselves are not served under their own names.
var variants = findVariants(dist)

func findVariants(fsys fs.FS) map[string]map[string]string {
	entries, _ := fs.ReadDir(fsys, ".")
	names := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			names[e.Name()] = true
		}
	}
	out := map[string]map[string]string{}
	for n := range names {
		copyOf := false
		for _, c := range codings {
			if base, ok := strings.CutSuffix(n, c.suffix); ok && names[base] {
				copyOf = true
			}
		}
		if copyOf {
			continue
		}
		out[n] = map[string]string{}
		for _, c := range codings {
			if names[n+c.suffix] {
				out[n][c.name] = n + c.suffix
			}
		}
	}
	return out
}

// Handler serves GET /static/{version}/{file}: immutable for a year, since
// the version changes with any content. Another version is not found.
//
// A file built with precompressed copies is answered in the one the
// request's Accept-Encoding prefers (brotli over gzip at equal weight,
// neither when refused with q=0), with that Content-Encoding, the
// original's Content-Type, and Vary: Accept-Encoding; each coding has its
// own ETag. Ranges and conditional requests apply to the bytes sent
// (http.ServeContent).
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, ok := strings.CutPrefix(r.URL.Path, "/static/"+version+"/")
		copies, found := variants[name]
		if !ok || !found {
			http.NotFound(w, r)
			return
		}
		served, coding := name, ""
		if c := negotiate(r.Header.Values("Accept-Encoding"), copies); c != "" {
			served, coding = copies[c], c
		}
		f, err := dist.Open(served)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		defer f.Close()
		content, ok := f.(io.ReadSeeker)
		info, err := f.Stat()
		if !ok || err != nil { // embed.FS files are seekers with a size
			http.Error(w, "static file cannot be read", http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
		h.Set("X-Content-Type-Options", "nosniff")
		ctype := mime.TypeByExtension(path.Ext(name))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		h.Set("Content-Type", ctype)
		if len(copies) > 0 && !varies(h) {
			h.Add("Vary", "Accept-Encoding")
		}
		etag := version
		if coding != "" {
			h.Set("Content-Encoding", coding)
			etag += "-" + coding
		}
		h.Set("ETag", `"`+etag+`"`)
		http.ServeContent(sized{w, info.Size()}, r, "", time.Time{}, content)
	})
}

// varies reports whether h already says Vary: Accept-Encoding (a wrapping
// middleware may have).
func varies(h http.Header) bool {
	for _, v := range h.Values("Vary") {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), "Accept-Encoding") {
				return true
			}
		}
	}
	return false
}

// sized gives a whole (200) answer its Content-Length: http.ServeContent
// leaves it out when Content-Encoding is set, expecting a writer that
// compresses on the fly, but here the content is the compressed copy
// itself. (A 206 gets the length of its range from ServeContent.)
type sized struct {
	http.ResponseWriter
	size int64
}

func (s sized) WriteHeader(code int) {
	if code == http.StatusOK {
		s.Header().Set("Content-Length", strconv.FormatInt(s.size, 10))
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s sized) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// negotiate picks, of the codings a file has copies in, the one an
// Accept-Encoding header (its values) weighs highest, preferring earlier
// codings at equal weight; "" for the file as it is: no header, nothing
// acceptable (q=0), or identity weighed higher (RFC 9110, 12.5.3). "*"
// weighs every coding the header does not name; x-gzip is gzip.
func negotiate(accept []string, copies map[string]string) string {
	weights := map[string]float64{}
	for _, v := range accept {
		for _, item := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(item, ";")
			name = strings.ToLower(strings.TrimSpace(name))
			if name == "" {
				continue
			}
			if name == "x-gzip" {
				name = "gzip"
			}
			q := 1.0
			for _, p := range strings.Split(params, ";") {
				k, val, _ := strings.Cut(p, "=")
				if strings.EqualFold(strings.TrimSpace(k), "q") {
					f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
					if err != nil || f < 0 || f > 1 {
						f = 0 // a weight that is not one refuses
					}
					q = f
				}
			}
			weights[name] = q
		}
	}
	weight := func(name string) (float64, bool) {
		if q, ok := weights[name]; ok {
			return q, true
		}
		q, ok := weights["*"]
		return q, ok
	}
	best, bestQ := "", 0.0
	for _, c := range codings {
		if _, ok := copies[c.name]; !ok {
			continue
		}
		if q, ok := weight(c.name); ok && q > bestQ {
			best, bestQ = c.name, q
		}
	}
	if q, ok := weights["identity"]; ok && q > bestQ {
		return ""
	}
	return best
}
