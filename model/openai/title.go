package openai

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/honestcancel/gateway/model"
)

// titlePrompt asks for a conversation's title; the request follows it as the
// user message (an echoing test server then answers with the request).
const titlePrompt = "Write a title of at most six words for a conversation that starts with the user's next message. " +
	"Reply with the title only: no quotes, no final punctuation, in the language of the message."

// titleRequestChars bounds the part of the request sent for a title.
const titleRequestChars = 2000

// Title asks the model, in one short non-streamed request (no retries, no
// tools), for a title for a conversation that starts with request. The
// engine cleans the answer (first line, at most 60 characters) and keeps the
// request's own start when this fails.
func (b *Backend) Title(ctx context.Context, request []model.Message) (string, error) {
	var text string
	for _, m := range request {
		if m.Role == model.RoleUser {
			text = m.Content
		}
	}
	if r := []rune(text); len(r) > titleRequestChars {
		text = string(r[:titleRequestChars])
	}
	p := sdk.ChatCompletionNewParams{
		Model:               shared.ChatModel(b.model),
		Messages:            []sdk.ChatCompletionMessageParamUnion{sdk.SystemMessage(titlePrompt), sdk.UserMessage(text)},
		MaxCompletionTokens: sdk.Int(24),
	}
	var raw *http.Response
	res, err := b.svc.New(ctx, p, option.WithResponseInto(&raw))
	if err != nil {
		status := 0
		if raw != nil {
			status = raw.StatusCode
		}
		return "", fmt.Errorf("title request: %w", requestError(err, status, raw, 0, b.model))
	}
	if len(res.Choices) == 0 {
		return "", errors.New("title request: the answer has no choice")
	}
	title := strings.Trim(strings.TrimSpace(res.Choices[0].Message.Content), `"'“”«»`)
	return strings.TrimRight(title, ".!"), nil
}
