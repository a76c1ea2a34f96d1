package main

// The OpenAI Responses API (docs/openai-api.md) driven by OpenAI's own Go
// SDK (openai-go v3) against the real binary, with the gateway's API
// tokens as the SDK's API key: a background response streamed, dropped
// and resumed with starting_after; a cancel mid-stream and its receipt;
// previous_response_id continuing and branching the thread; and the
// refusals (an unknown model, parameters the gateway does not take,
// another user's ids). The Node SDK does the same in
// e2e/openai-sdk.test.mjs.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/honestcancel/gateway/chat"
)

// sdkClient is the OpenAI Go SDK pointed at the gateway, its API key one
// of the gateway's tokens; every option is given (NewClient reads
// OPENAI_* variables otherwise) and nothing is retried, so that what the
// test sees is what the gateway answered.
func sdkClient(base, token string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(token), option.WithOrganization(""),
		option.WithProject(""), option.WithMaxRetries(0))
}

// sdkGateway is the gateway's extension field of a response, as the SDK
// hands it over (its raw JSON).
type sdkGateway struct {
	RunID        string         `json:"run_id"`
	ThreadID     string         `json:"thread_id"`
	Status       chat.RunStatus `json:"status"`
	CheckpointID string         `json:"checkpoint_id"`
	Receipt      *struct {
		DiscardedStreamChars int64                   `json:"discarded_stream_chars"`
		ResumeCheckpointID   string                  `json:"resume_checkpoint_id"`
		PublishedMessageID   *string                 `json:"published_message_id"`
		CancelReason         string                  `json:"cancel_reason"`
		RequestedBy          string                  `json:"requested_by"`
		Operations           []chat.OperationOutcome `json:"operations"`
	} `json:"receipt"`
}

func gatewayOf(t *testing.T, raw string) sdkGateway {
	t.Helper()
	var w struct {
		Gateway *sdkGateway `json:"gateway"`
	}
	if err := json.Unmarshal([]byte(raw), &w); err != nil || w.Gateway == nil {
		t.Fatalf("a response without the gateway field (%v): %s", err, raw)
	}
	return *w.Gateway
}

// sdkEvents reads a stream to its end (or until stop says so) and returns
// its events.
func sdkEvents(t *testing.T, s interface {
	Next() bool
	Current() responses.ResponseStreamEventUnion
	Err() error
	Close() error
}, stop func(responses.ResponseStreamEventUnion) bool) []responses.ResponseStreamEventUnion {
	t.Helper()
	var out []responses.ResponseStreamEventUnion
	for s.Next() {
		ev := s.Current()
		out = append(out, ev)
		if stop != nil && stop(ev) {
			s.Close()
			return out
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream: %v (after %d events)", err, len(out))
	}
	return out
}

func sdkDeltas(evs []responses.ResponseStreamEventUnion) string {
	var b strings.Builder
	for _, e := range evs {
		if e.Type == "response.output_text.delta" {
			b.WriteString(e.Delta)
		}
	}
	return b.String()
}

// wantAPIError requires err to be the API's answer with status, code and
// param.
func wantAPIError(t *testing.T, what string, err error, status int, code, param string) *openai.Error {
	t.Helper()
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != status || apiErr.Code != code || apiErr.Param != param || apiErr.Message == "" {
		t.Errorf("%s: %v (%+v), want %d %s naming %q", what, err, apiErr, status, code, param)
	}
	return apiErr
}

func TestOpenAIGoSDK(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "gw.db")
	addUser(t, db, "alice", "alice's long password")
	addUser(t, db, "bob", "bob's long password")
	tokA, _ := createToken(t, db, "alice")
	tokB, _ := createToken(t, db, "bob")
	srv := startProcess(t, db, "15ms", "-auth", "password")
	alice, bob := sdkClient(srv.base, tokA), sdkClient(srv.base, tokB)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// messages reads a thread's history through the gateway's own API.
	messages := func(threadID string) []string {
		t.Helper()
		resp, body := srv.send(who{bearer: tokA}, http.MethodGet, "/api/threads/"+threadID, nil)
		var snap chat.Snapshot
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &snap) != nil {
			t.Fatalf("GET /api/threads/%s: %d %s", threadID, resp.StatusCode, body)
		}
		var out []string
		for _, m := range snap.Messages {
			out = append(out, m.Content)
		}
		return out
	}

	models, err := alice.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "demo" {
		t.Fatalf("models: %+v, %v", models, err)
	}

	// A background response, streamed; the stream dropped after three
	// deltas, then resumed after the last event received.
	question := "How were lighthouses kept lit before electricity?"
	deltas := 0
	first := sdkEvents(t, alice.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: "demo", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(question)},
		Background: openai.Bool(true), Metadata: shared.Metadata{"suite": "go"},
	}), func(e responses.ResponseStreamEventUnion) bool {
		if e.Type == "response.output_text.delta" {
			deltas++
		}
		return deltas == 3
	})
	if first[0].Type != "response.created" || first[0].SequenceNumber != 0 || !strings.HasPrefix(first[0].Response.ID, "resp_run_") {
		t.Fatalf("the stream starts with %s", first[0].RawJSON())
	}
	id := first[0].Response.ID
	last := first[len(first)-1].SequenceNumber
	rest := sdkEvents(t, alice.Responses.GetStreaming(ctx, id, responses.ResponseGetParams{StartingAfter: openai.Int(last)}), nil)
	all := append(first, rest...)
	for i, e := range all {
		if e.SequenceNumber != int64(i) {
			t.Fatalf("event %d (%s) is numbered %d: a duplicate or a gap", i, e.Type, e.SequenceNumber)
		}
	}
	end := all[len(all)-1]
	if end.Type != "response.completed" || end.Response.Status != "completed" {
		t.Fatalf("the resumed stream ends with %s", end.RawJSON())
	}
	r1, err := alice.Responses.Get(ctx, id, responses.ResponseGetParams{})
	if err != nil {
		t.Fatal(err)
	}
	g1 := gatewayOf(t, r1.RawJSON())
	hist := messages(g1.ThreadID)
	if r1.Status != "completed" || r1.OutputText() == "" || r1.OutputText() != sdkDeltas(all) || r1.Metadata["suite"] != "go" ||
		len(hist) != 2 || hist[0] != question || hist[1] != r1.OutputText() {
		t.Fatalf("response %s\nstreamed %q\nthread %q", r1.RawJSON(), sdkDeltas(all), hist)
	}

	// previous_response_id continues the thread from where that response
	// ended: the second reply's context holds the first exchange.
	r2, err := alice.Responses.New(ctx, responses.ResponseNewParams{
		Model: "demo", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and what about foghorns?")},
		PreviousResponseID: openai.String(id), Instructions: openai.String("Answer briefly."),
	})
	if err != nil {
		t.Fatal(err)
	}
	g2 := gatewayOf(t, r2.RawJSON())
	hist = messages(g1.ThreadID)
	if r2.Status != "completed" || g2.ThreadID != g1.ThreadID || r2.PreviousResponseID != id || r2.Instructions.OfString != "Answer briefly." ||
		strings.Join(hist, "|") != strings.Join([]string{question, r1.OutputText(), "and what about foghorns?", r2.OutputText()}, "|") {
		t.Fatalf("continuing %s: %s\nthread %q", id, r2.RawJSON(), hist)
	}

	// A cancel mid-stream: the stream ends with the cancel and nothing
	// published; the receipt says what the gateway's own API says.
	s := alice.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: "demo", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("endless: the history of lighthouses")},
		Background: openai.Bool(true), PreviousResponseID: openai.String(r2.ID),
	})
	// Dropped at its first delta, and followed again: the response runs on.
	streamed := sdkEvents(t, s, func(e responses.ResponseStreamEventUnion) bool { return e.Type == "response.output_text.delta" })
	stopID := streamed[0].Response.ID
	live := alice.Responses.GetStreaming(ctx, stopID, responses.ResponseGetParams{StartingAfter: openai.Int(streamed[len(streamed)-1].SequenceNumber)})
	if !live.Next() {
		t.Fatalf("the resumed stream of a running response ended: %v", live.Err())
	}
	streamed = append(streamed, live.Current())
	stopped, err := alice.Responses.Cancel(ctx, stopID)
	if err != nil {
		t.Fatal(err)
	}
	streamed = append(streamed, sdkEvents(t, live, nil)...)
	gs := gatewayOf(t, stopped.RawJSON())
	if stopped.Status != "cancelled" || gs.Status != chat.RunCancelled || gs.Receipt == nil || len(stopped.Output) != 0 {
		t.Fatalf("the cancel answered %s", stopped.RawJSON())
	}
	tail := streamed[len(streamed)-1]
	if tail.Type != "response.cancelled" || tail.Response.Status != "cancelled" {
		t.Fatalf("the stream of the cancelled response ends with %s", tail.RawJSON())
	}
	for i, e := range streamed {
		if e.SequenceNumber != int64(i) || strings.HasSuffix(e.Type, ".done") {
			t.Fatalf("event %d of the cancelled stream: %s", i, e.RawJSON())
		}
	}
	resp, body := srv.send(who{bearer: tokA}, http.MethodGet, "/api/runs/"+gs.RunID, nil)
	var run chat.Run
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &run) != nil {
		t.Fatalf("GET /api/runs/%s: %d %s", gs.RunID, resp.StatusCode, body)
	}
	rc := gs.Receipt
	if rc.DiscardedStreamChars != run.DiscardedStreamChars || rc.ResumeCheckpointID != *run.ResumeCheckpointID ||
		rc.CancelReason != *run.CancelReason || rc.RequestedBy != *run.RequestedBy || rc.RequestedBy != "api:http" ||
		rc.DiscardedStreamChars < int64(len([]rune(sdkDeltas(streamed)))) || rc.Operations == nil {
		t.Fatalf("receipt %+v, run %s, streamed %d characters", rc, body, len([]rune(sdkDeltas(streamed))))
	}
	if gt := gatewayOf(t, tail.Response.RawJSON()); gt.Receipt == nil || gt.Receipt.DiscardedStreamChars != rc.DiscardedStreamChars {
		t.Fatalf("the stream's last event carries %s", tail.Response.RawJSON())
	}
	hist = messages(g1.ThreadID)
	if len(hist) != 5 || hist[4] != "endless: the history of lighthouses" {
		t.Fatalf("after the cancel the thread holds %q: nothing of the reply may be published", hist)
	}

	// A response that is no longer the head is continued as a branch.
	r3, err := alice.Responses.New(ctx, responses.ResponseNewParams{
		Model: "demo", Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage("and lightships?", responses.EasyInputMessageRoleUser)}},
		PreviousResponseID: openai.String(id),
	})
	if err != nil {
		t.Fatal(err)
	}
	hist = messages(g1.ThreadID)
	if r3.Status != "completed" || strings.Join(hist, "|") != strings.Join([]string{question, r1.OutputText(), "and lightships?", r3.OutputText()}, "|") {
		t.Fatalf("the branch: %s\nthread %q", r3.RawJSON(), hist)
	}

	// Refusals, in OpenAI's error shape with the gateway's codes.
	in := responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}
	_, err = alice.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-4o", Input: in})
	wantAPIError(t, "an unknown model", err, 404, "model_not_found", "model")
	_, err = alice.Responses.New(ctx, responses.ResponseNewParams{Model: "demo", Input: in, Temperature: openai.Float(0.2)})
	wantAPIError(t, "temperature", err, 400, "invalid_request", "temperature")
	_, err = alice.Responses.New(ctx, responses.ResponseNewParams{Model: "demo", Input: in, Tools: []responses.ToolUnionParam{
		responses.ToolParamOfFunction("lookup", map[string]any{"type": "object"}, false)}})
	wantAPIError(t, "tools", err, 400, "invalid_request", "tools")
	_, err = alice.Responses.New(ctx, responses.ResponseNewParams{Model: "demo", Input: in, Store: openai.Bool(false)})
	wantAPIError(t, "store false", err, 400, "invalid_request", "store")
	unknown := chat.ResponseID(chat.NewID(chat.PrefixRun))
	for _, probe := range []struct {
		id  string
		who openai.Client
	}{{id, bob}, {unknown, alice}} {
		_, err = probe.who.Responses.Get(ctx, probe.id, responses.ResponseGetParams{})
		wantAPIError(t, "retrieve "+probe.id, err, 404, "not_found", "")
		_, err = probe.who.Responses.Cancel(ctx, probe.id)
		wantAPIError(t, "cancel "+probe.id, err, 404, "not_found", "")
		_, err = probe.who.Responses.New(ctx, responses.ResponseNewParams{Model: "demo", Input: in, PreviousResponseID: openai.String(probe.id)})
		wantAPIError(t, "continue "+probe.id, err, 404, "not_found", "previous_response_id")
		rs := probe.who.Responses.GetStreaming(ctx, probe.id, responses.ResponseGetParams{StartingAfter: openai.Int(0)})
		rs.Next()
		wantAPIError(t, "stream "+probe.id, rs.Err(), 404, "not_found", "")
		rs.Close()
	}
	stranger := sdkClient(srv.base, tokA+"x")
	_, err = stranger.Responses.Get(ctx, id, responses.ResponseGetParams{})
	wantAPIError(t, "a wrong key", err, 401, "unauthorized", "")
	if after := messages(g1.ThreadID); strings.Join(after, "|") != strings.Join(hist, "|") {
		t.Fatalf("the refusals changed alice's thread: %q", after)
	}
	srv.Stop()
	checkDB(t, db)
}
