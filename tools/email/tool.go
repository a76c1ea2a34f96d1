// Package email is the send_email tool (contract consequential) and the
// simulated external email provider it hands emails to (Outbox): a
// provider that honours idempotency keys and can be told to misbehave as
// real ones do (rejections, lost answers, keys recorded late, the gateway
// dying after the provider accepted), so the gateway's receipts can be tested
// against every outcome a real provider can leave behind.
package email

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/schema"
)

const emailSchema = `{
  "type": "object",
  "properties": {
    "to": {"type": "string", "format": "email", "maxLength": 254, "description": "Recipient address, e.g. ann@example.com."},
    "subject": {"type": "string", "minLength": 1, "maxLength": 200},
    "body": {"type": "string", "minLength": 1, "maxLength": 10000}
  },
  "required": ["to", "subject", "body"],
  "additionalProperties": false
}`

// SendEmail is the send_email tool (contract consequential). It hands the
// email to an Outbox, the (simulated) external provider, under the
// business idempotency key made by Prepare.
type SendEmail struct {
	*schema.Tool
	outbox *Outbox
}

var _ tools.Resender = (*SendEmail)(nil)

// ResendSafe implements tools.Resender: the provider acts once per key.
func (s *SendEmail) ResendSafe() bool { return true }

// NewSendEmail returns the tool committing to outbox.
func NewSendEmail(outbox *Outbox) *SendEmail {
	return &SendEmail{
		Tool: schema.MustTool(tools.Spec{
			Name:        "send_email",
			Description: "Send an email. The user sees the draft and must confirm before it is sent.",
			Contract:    tools.Consequential,
		}, emailSchema),
		outbox: outbox,
	}
}

// EmailDraft is the preview of send_email and its decoded arguments.
type EmailDraft struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
	Body    string `json:"body"`
}

// EmailResult is send_email's result, from Commit and from Status.
type EmailResult struct {
	Status     string `json:"status"` // "committed"
	ProviderID string `json:"provider_id"`
	Key        string `json:"key"`
	// AlreadySent: the provider had accepted the key before (the same
	// step, resumed or forked, asked again): nothing was sent this time.
	AlreadySent bool `json:"already_sent,omitempty"`
}

func (s *SendEmail) draft(args json.RawMessage) (EmailDraft, json.RawMessage, error) {
	norm, err := s.Validate(args)
	if err != nil {
		return EmailDraft{}, nil, err
	}
	var d EmailDraft
	if err := json.Unmarshal(norm, &d); err != nil {
		return EmailDraft{}, nil, &tools.InvalidArgs{Reason: err.Error()}
	}
	return d, norm, nil
}

// EmailKey is the idempotency key of sending the email whose normalised
// arguments are norm in scope (the step of the conversation that drafts
// it): "email:<scope>:<16 hex of sha256>:send".
func EmailKey(scope string, norm json.RawMessage) string {
	sum := sha256.Sum256(norm)
	return "email:" + scope + ":" + hex.EncodeToString(sum[:])[:16] + ":send"
}

// Prepare implements tools.Committer: the preview is {"to","subject","body"} and
// the key depends on scope and the normalised arguments only, so the same
// draft of the same step (resumed, or continued in a fork) always has the
// same key.
func (s *SendEmail) Prepare(scope string, args json.RawMessage) (json.RawMessage, string, error) {
	if scope == "" {
		return nil, "", errors.New("send_email: empty scope")
	}
	d, norm, err := s.draft(args)
	if err != nil {
		return nil, "", err
	}
	preview, err := schema.Compact(d)
	if err != nil {
		return nil, "", err
	}
	return preview, EmailKey(scope, norm), nil
}

// Commit implements tools.Committer. tools.ErrRejected (wrapped) means the provider
// refused and sent nothing; any other error leaves the outcome unknown
// until tools.Status says.
func (s *SendEmail) Commit(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error) {
	if key == "" {
		return nil, errors.New("send_email: empty idempotency key")
	}
	d, _, err := s.draft(args)
	if err != nil {
		return nil, err
	}
	sent, err := s.outbox.Deliver(ctx, key, Email{To: d.To, Subject: d.Subject, Body: d.Body})
	if err != nil {
		return nil, err // tools.ErrRejected (wrapped) or an unknown outcome, as the outbox said
	}
	return schema.Compact(EmailResult{Status: "committed", ProviderID: sent.ProviderID, Key: key, AlreadySent: sent.Duplicate})
}

// Status implements tools.Committer: Known when the provider holds key,
// with the result Commit returned (or would have).
func (s *SendEmail) Status(ctx context.Context, key string) (tools.Status, error) {
	id, found, err := s.outbox.Lookup(ctx, key)
	if err != nil {
		return tools.Status{}, fmt.Errorf("send_email: %w", err)
	}
	if !found {
		return tools.Status{}, nil
	}
	res, err := schema.Compact(EmailResult{Status: "committed", ProviderID: id, Key: key})
	if err != nil {
		return tools.Status{}, err
	}
	return tools.Status{Known: true, Result: res}, nil
}
