package main

// The real binary with -model openai against a Go fake of a chat
// completions endpoint, and the configuration errors of -model openai.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

const fakeKey = "sk-binary-test-key"

func TestBinaryOpenAI(t *testing.T) {
	fake := apptest.NewFakeOpenAI(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte(fakeKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startServerWith(t, filepath.Join(dir, "gw.db"), "0s",
		"-model", "openai", "-openai-base-url", fake.URL+"/v1", "-openai-model", "test-model", "-openai-api-key-file", keyFile)

	thread := srv.CreateThread()
	tid := thread.ThreadID
	evs := srv.Events(tid, thread.LastSeq)
	start := func(version int64, text string) chat.RunStartAck { return srv.StartRun(tid, version, text) }

	// A streamed reply is published.
	run1 := start(1, "hello")
	var published *chat.Message
	evs.WaitFor(time.Now().Add(20*time.Second), "run.completed", func(ev client.Event) bool {
		if ev.RunID == run1.RunID && ev.Type == chat.EventRunFailed {
			t.Fatalf("run failed: %s", ev.Raw)
		}
		if p := ev.Published(); p != nil && p.Message.Role == "assistant" {
			published = &p.Message
		}
		return ev.Type == chat.EventRunCompleted && ev.RunID == run1.RunID
	})
	if published == nil || published.Content != "Hello from the fake." {
		t.Fatalf("published %+v, want the fake's reply", published)
	}

	// Cancel closes the upstream request; nothing of it is published.
	run2 := start(srv.Snapshot(tid).StateVersion, "stall")
	evs.WaitDeltas(time.Now().Add(20*time.Second), run2.RunID, 1)
	srv.CancelRun(run2.RunID)
	select {
	case <-fake.UpstreamClosed:
	case <-time.After(5 * time.Second):
		t.Fatal("the fake did not see the upstream request end within 5s of the cancel")
	}
	cancelled := evs.WaitFor(time.Now().Add(10*time.Second), "run.cancelled", func(ev client.Event) bool {
		if ev.RunID == run2.RunID && (ev.Type == chat.EventMessagePublished || ev.Type == chat.EventRunCompleted) {
			t.Fatalf("the cancelled run emitted %s", ev.Raw)
		}
		return ev.Type == chat.EventRunCancelled && ev.RunID == run2.RunID
	})
	if cancelled.Cancelled().DiscardedStreamChars != int64(len("Once upon a time")) {
		t.Errorf("run.cancelled %s, want discarded_stream_chars %d", cancelled.Raw, len("Once upon a time"))
	}

	// An upstream refusal fails the run with words a user understands.
	run3 := start(srv.Snapshot(tid).StateVersion, "fail")
	failed := evs.WaitFor(time.Now().Add(20*time.Second), "run.failed", func(ev client.Event) bool {
		return ev.Type == chat.EventRunFailed && ev.RunID == run3.RunID
	})
	if raw := string(failed.Raw); !strings.Contains(raw, "refused the API key (401)") || strings.Contains(raw, fakeKey) {
		t.Errorf("run.failed %s, want the 401 explained and no key", raw)
	}

	for _, a := range fake.Auth() {
		if a != "Bearer "+fakeKey {
			t.Errorf("Authorization %q, want the key from the file", a)
		}
	}
	if logs := srv.Stderr(); strings.Contains(logs, fakeKey) {
		t.Error("the server log contains the API key")
	}
}

func TestCLIOpenAIConfig(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "never.db")
	emptyKey := filepath.Join(dir, "empty")
	keyFile := filepath.Join(dir, "key")
	os.WriteFile(emptyKey, []byte("\n"), 0o600)
	os.WriteFile(keyFile, []byte(fakeKey), 0o600)
	base := []string{"-addr", "127.0.0.1:0", "-db", db, "-model", "openai"}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no model name", []string{"GATEWAY_OPENAI_API_KEY=" + fakeKey}, nil, "GATEWAY_OPENAI_MODEL"},
		{"no key for api.openai.com", nil, []string{"-openai-model", "gpt-4o-mini"}, "GATEWAY_OPENAI_API_KEY"},
		{"key twice", []string{"GATEWAY_OPENAI_API_KEY=" + fakeKey}, []string{"-openai-model", "m", "-openai-api-key-file", keyFile}, "not both"},
		{"missing key file", nil, []string{"-openai-model", "m", "-openai-api-key-file", filepath.Join(dir, "nope")}, filepath.Join(dir, "nope")},
		{"empty key file", nil, []string{"-openai-model", "m", "-openai-api-key-file", emptyKey}, "is empty"},
		{"key as a flag", nil, []string{"-openai-model", "m", "-openai-api-key", fakeKey}, "openai-api-key"},
		{"bad base URL", nil, []string{"-openai-model", "m", "-openai-base-url", "localhost:11434"}, "base URL"},
		{"bad header env", []string{"GATEWAY_OPENAI_API_KEY=" + fakeKey, "GATEWAY_OPENAI_HEADERS=X-A: 1, broken"}, []string{"-openai-model", "m"}, "GATEWAY_OPENAI_HEADERS"},
		{"bad temperature", []string{"GATEWAY_OPENAI_API_KEY=" + fakeKey, "GATEWAY_OPENAI_TEMPERATURE=hot"}, []string{"-openai-model", "m"}, "GATEWAY_OPENAI_TEMPERATURE"},
		{"unknown model backend", nil, []string{"-model", "claude"}, "demo or openai"},
		{"bad max completion tokens", []string{"GATEWAY_OPENAI_API_KEY=" + fakeKey, "GATEWAY_OPENAI_MAX_COMPLETION_TOKENS=0"}, []string{"-openai-model", "m"}, "GATEWAY_OPENAI_MAX_COMPLETION_TOKENS"},
		{"reply limit too small", []string{"GATEWAY_OPENAI_API_KEY=" + fakeKey}, []string{"-openai-model", "m", "-max-reply-bytes", "10"}, "-max-reply-bytes 10 is out of range: use 1024 to 4194304"},
		{"reply limit too large", []string{"GATEWAY_OPENAI_API_KEY=" + fakeKey}, []string{"-openai-model", "m", "-max-reply-bytes", "4194305"}, "-max-reply-bytes 4194305 is out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.env, append(append([]string{}, base...), tc.args...)...)
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q, stdout %q; want exit 2 and a message with %q", code, errOut, out, tc.want)
			}
			if strings.Contains(errOut, fakeKey) && tc.name != "key as a flag" {
				t.Errorf("stderr shows the API key: %q", errOut)
			}
			if _, err := os.Stat(db); err == nil {
				t.Fatalf("a refused configuration created the database %s", db)
			}
		})
	}
}
