package web

import "testing"

// localNext never sends a signed-in browser to another site.
func TestLocalNextStaysOnThisSite(t *testing.T) {
	for in, want := range map[string]string{
		"/t/thr_1":             "/t/thr_1",
		"/t/thr_1?x=1":         "/t/thr_1?x=1",
		"":                     "/",
		"t/thr_1":              "/",
		"//evil.example/x":     "/",
		"/\\evil.example/x":    "/",
		"/\t/evil.example/x":   "/",
		"/\n/evil.example":     "/",
		"/\x7f/evil.example":   "/",
		"https://evil.example": "/",
		"javascript:alert(1)":  "/",
		"/%2F/evil.example":    "/%2F/evil.example", // a path on this server, not a host
	} {
		if got := localNext(in); got != want {
			t.Errorf("localNext(%q) = %q, want %q", in, got, want)
		}
	}
}
