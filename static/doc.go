// Package static will hold the browser client's bundle and CSS, embedded
// with go:embed and served under a content hash (the chat UI issue).
package static
