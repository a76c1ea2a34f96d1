package gateway

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
)

// FuzzResponseCreate: any body of POST /v1/responses is either refused as
// invalid_request (naming the parameter whenever one is at fault) or read
// into a request whose input is a user message within its limits, or
// absent only to continue a previous response.
func FuzzResponseCreate(f *testing.F) {
	for _, s := range []string{
		`{"model":"demo","input":"hi"}`,
		`{"model":"demo","input":[{"role":"user","content":"hi"}],"background":true,"stream":true}`,
		`{"model":"demo","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]}`,
		`{"model":"demo","previous_response_id":"resp_run_1","metadata":{"a":"b"},"instructions":"x","store":true}`,
		`{"model":"demo","input":"hi","temperature":0.2}`,
		`{"model":"demo","input":"a","input":"b"}`,
		`{"model":null,"input":null}`,
		`[{"model":"demo"}]`,
		`{"model":"demo","input":[{"role":"user","content":[{"type":"input_image"}]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := parseCreate(data)
		if err != nil {
			wantInvalid(t, "parseCreate", err)
			return
		}
		switch {
		case req.input == nil && req.previous == "":
			t.Fatalf("accepted without input or previous_response_id: %s", data)
		case req.input != nil && (*req.input == "" || len(*req.input) > chat.MaxUserMessageBytes || !utf8.ValidString(*req.input)):
			t.Fatalf("accepted input %q", *req.input)
		case !strings.Contains(string(data), `"model"`):
			t.Fatalf("accepted without a model: %s", data)
		}
		start := chat.StartRun{UserMessage: req.input, Response: &chat.ResponseRequest{Model: req.model,
			Instructions: req.instructions, Metadata: req.metadata, PreviousResponseID: req.previous}}
		if err := paramOf(start.Validate()); err != nil {
			wantInvalid(t, "Validate", err)
			if _, ok := err.(*chat.Error).Fields[fieldParam]; !ok {
				t.Fatalf("a refusal that names no parameter: %v", err)
			}
		}
	})
}
