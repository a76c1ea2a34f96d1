package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// Client is a program's access to one gateway: the HTTP API (one method
// per route), event streams (Events) and WebSocket connections (Connect).
//
// A Client holds only its configuration and is safe for concurrent use by
// any number of goroutines. The Streams and Conns it opens are owned by
// whoever opened them, who must Close them; Client.Close does not.
type Client struct {
	base       *url.URL
	http       *http.Client // requests
	streaming  *http.Client // event streams and WebSocket handshakes: no Timeout
	ownsHTTP   bool         // http was made here: Close closes its idle connections
	header     http.Header  // sent with every request: credentials, X-Client-Name
	cookie     *http.Cookie
	origin     string
	host       string
	idle       time.Duration
	minBackoff time.Duration
	maxBackoff time.Duration
}

// Option configures a Client (see New).
type Option func(*Client) error

// Cookie names of a session (package auth): over https the server names
// its cookie with the __Host- prefix.
const (
	sessionCookie       = "gateway_session"
	secureSessionCookie = "__Host-" + sessionCookie
)

// WithBearerToken authenticates every request and connection with
// "Authorization: Bearer <token>": an API token, made with `gateway token
// create -user NAME`. It works in the password and header auth modes.
func WithBearerToken(token string) Option {
	return func(c *Client) error {
		if strings.TrimSpace(token) == "" || strings.ContainsAny(token, "\r\n") {
			return errors.New("client: WithBearerToken needs a token")
		}
		c.header.Set("Authorization", "Bearer "+token)
		return nil
	}
}

// WithSessionCookie authenticates with the session cookie of a signed-in
// browser session (auth mode password), under the name the server gives
// it: gateway_session, or __Host-gateway_session over https.
func WithSessionCookie(value string) Option {
	return func(c *Client) error {
		if value == "" {
			return errors.New("client: WithSessionCookie needs the cookie's value")
		}
		c.cookie = &http.Cookie{Name: sessionCookie, Value: value}
		return nil
	}
}

// WithProxyUser names the user in a trusted reverse-proxy header (auth
// mode header): header is the server's -auth-header ("" =
// X-Forwarded-User). The server believes it only from its
// -trusted-proxies, so use this when the program is such a proxy (or
// reaches the server through one that passes the header on).
func WithProxyUser(header, user string) Option {
	return func(c *Client) error {
		if header == "" {
			header = "X-Forwarded-User"
		}
		if user == "" {
			return errors.New("client: WithProxyUser needs a user name")
		}
		c.header.Set(header, user)
		return nil
	}
}

var clientNamePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// WithClientName sends X-Client-Name: a cancel or thread delete made over
// HTTP is then recorded as requested_by "api:<name>" (else "api:http").
// 1–64 of A-Za-z0-9._-.
func WithClientName(name string) Option {
	return func(c *Client) error {
		if !clientNamePattern.MatchString(name) {
			return fmt.Errorf("client: client name %q: 1 to 64 of A-Za-z0-9._-", name)
		}
		c.header.Set("X-Client-Name", name)
		return nil
	}
}

// WithHTTPClient sends every request through hc (its Transport, proxy,
// TLS settings, cookie jar, Timeout). hc stays the caller's: Client.Close
// leaves it alone. Its Timeout bounds plain requests only: event streams
// and WebSocket connections are long-lived and bounded by their contexts
// and Close (their handshakes are bounded by hc.Timeout).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) error {
		if hc == nil {
			return errors.New("client: WithHTTPClient(nil)")
		}
		c.http, c.ownsHTTP = hc, false
		return nil
	}
}

// WithOrigin sends an Origin header with WebSocket handshakes. A program
// needs none: the gateway accepts a handshake without Origin. One that
// sends an Origin must send the server's own (scheme://host:port of the
// base URL) or one the server lists in -origins; any other is refused 403
// forbidden (a page of another site). HTTP requests never carry one, so
// the server's cross-site check lets them pass.
func WithOrigin(origin string) Option {
	return func(c *Client) error {
		u, err := url.Parse(origin)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return fmt.Errorf("client: origin %q is not scheme://host", origin)
		}
		c.origin = origin
		return nil
	}
}

// WithHost sends host in the Host header instead of the base URL's host.
// The gateway answers only to its own names (-allowed-hosts; loopback
// names on a loopback address) and refuses any other Host with 403
// forbidden, against DNS rebinding: a program that reaches the server by
// another name or address (an SSH tunnel, a container's IP) sends one of
// those names here.
func WithHost(host string) Option {
	return func(c *Client) error {
		if host == "" || strings.ContainsAny(host, "/ \r\n") {
			return fmt.Errorf("client: host %q is not a host name", host)
		}
		c.host = host
		return nil
	}
}

// WithIdleTimeout is how long an event stream or WebSocket connection may
// receive nothing at all (the server sends a keep-alive comment or ping
// every -ws-ping-interval, 20 s by default) before the client takes it
// for dead and reconnects. Default 90 s; a negative value disables it.
func WithIdleTimeout(d time.Duration) Option {
	return func(c *Client) error {
		c.idle = d
		return nil
	}
}

// WithBackoff spaces reconnection attempts: the first after about min,
// doubling up to max (defaults 100 ms and 5 s).
func WithBackoff(min, max time.Duration) Option {
	return func(c *Client) error {
		if min <= 0 || max < min {
			return fmt.Errorf("client: backoff %v..%v: want 0 < min <= max", min, max)
		}
		c.minBackoff, c.maxBackoff = min, max
		return nil
	}
}

// New returns a Client of the gateway at baseURL (http://host:port, or
// https://; a path prefix is kept, for a gateway behind a proxy under a
// path). Without an auth option it sends no credentials, which suits auth
// mode none (a loopback server's one local user).
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("client: base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q: want http://host[:port] or https://…", baseURL)
	}
	u.RawQuery, u.Fragment = "", ""
	u.Path = strings.TrimSuffix(u.Path, "/")
	c := &Client{base: u, header: http.Header{}, idle: 90 * time.Second,
		minBackoff: 100 * time.Millisecond, maxBackoff: 5 * time.Second}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	if c.http == nil {
		c.http = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		c.ownsHTTP = true
	}
	streaming := *c.http
	streaming.Timeout = 0
	c.streaming = &streaming
	if c.cookie != nil && u.Scheme == "https" {
		c.cookie.Name = secureSessionCookie
	}
	return c, nil
}

// Close releases the idle connections of the HTTP transport the Client
// made itself (none when WithHTTPClient gave one). Streams and Conns are
// closed by their owners.
func (c *Client) Close() {
	if c.ownsHTTP {
		c.http.CloseIdleConnections()
	}
}

// BaseURL is the gateway's base URL, as given to New.
func (c *Client) BaseURL() string { return c.base.String() }

// endpoint is the URL of path (which starts with "/" and holds escaped
// ids) under the base.
func (c *Client) endpoint(path string, query url.Values) string {
	s := c.base.String() + path
	if len(query) > 0 {
		s += "?" + query.Encode()
	}
	return s
}

// authorize puts the credentials and client headers on h.
func (c *Client) authorize(h http.Header) {
	for k, v := range c.header {
		h[k] = v
	}
	if c.cookie != nil {
		h.Add("Cookie", c.cookie.String())
	}
}

// maxAnswer bounds an API answer read into memory (a snapshot holds a
// thread's whole history).
const maxAnswer = 64 << 20

// call sends one API request and decodes its 2xx JSON answer into out
// (when not nil); any other answer is an *Error.
func (c *Client) call(ctx context.Context, method, path string, query url.Values, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("client: encode %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.endpoint(path, query), rd)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	c.authorize(req.Header)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.host != "" {
		req.Host = c.host
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return fmt.Errorf("client: %s %s: read the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return parseError(resp.StatusCode, resp.Header, data)
	}
	if len(data) > maxAnswer {
		return fmt.Errorf("client: %s %s: answer over %d bytes", method, path, maxAnswer)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("client: %s %s: unreadable answer: %w", method, path, err)
	}
	return nil
}

// esc escapes an id for a path segment.
func esc(id string) string { return url.PathEscape(id) }

// CreateThread creates a thread (POST /api/threads) and returns its
// snapshot (state_version 1, an empty history). title "" leaves the
// server to name it after its first request.
func (c *Client) CreateThread(ctx context.Context, title string) (chat.Snapshot, error) {
	body := map[string]string{}
	if title != "" {
		body["title"] = title
	}
	return callFor[chat.Snapshot](ctx, c, http.MethodPost, "/api/threads", body)
}

// ListThreads returns one page of the caller's threads (GET
// /api/threads), newest updated first.
func (c *Client) ListThreads(ctx context.Context, o ListThreadsOptions) (ThreadPage, error) {
	q := url.Values{}
	if o.Limit != 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	if o.Query != "" {
		q.Set("q", o.Query)
	}
	var page struct {
		Threads    []chat.Thread `json:"threads"`
		NextCursor *string       `json:"next_cursor"`
	}
	if err := c.call(ctx, http.MethodGet, "/api/threads", q, nil, &page); err != nil {
		return ThreadPage{}, err
	}
	out := ThreadPage{Threads: page.Threads}
	if page.NextCursor != nil {
		out.NextCursor = *page.NextCursor
	}
	return out, nil
}

// Thread returns a thread's snapshot (GET /api/threads/{id}): its head's
// history, the run in flight with its partial text, the last run's
// outcome.
func (c *Client) Thread(ctx context.Context, threadID string) (chat.Snapshot, error) {
	return callFor[chat.Snapshot](ctx, c, http.MethodGet, "/api/threads/"+esc(threadID), nil)
}

// Run returns a run (GET /api/runs/{id}).
func (c *Client) Run(ctx context.Context, runID string) (chat.Run, error) {
	return callFor[chat.Run](ctx, c, http.MethodGet, "/api/runs/"+esc(runID), nil)
}

// Operations returns a thread's tool calls, oldest first (GET
// /api/threads/{id}/operations).
func (c *Client) Operations(ctx context.Context, threadID string) ([]chat.Operation, error) {
	var out struct {
		Operations []chat.Operation `json:"operations"`
	}
	err := c.call(ctx, http.MethodGet, "/api/threads/"+esc(threadID)+"/operations", nil, nil, &out)
	return out.Operations, err
}

// Checkpoints returns a thread's checkpoints, oldest first, and its head
// (GET /api/threads/{id}/checkpoints).
func (c *Client) Checkpoints(ctx context.Context, threadID string) (Checkpoints, error) {
	return callFor[Checkpoints](ctx, c, http.MethodGet, "/api/threads/"+esc(threadID)+"/checkpoints", nil)
}

// History returns a page of a thread's history, oldest first
// (GET /api/threads/{id}/messages): the messages just before the message
// before ("": the latest), at most limit of them (0: the server's default,
// 50) and 1 MiB of content but for the newest. Its NextBefore is the before
// of the next older page, nil when the page starts the history.
func (c *Client) History(ctx context.Context, threadID, before string, limit int) (chat.HistoryPage, error) {
	q := url.Values{}
	if before != "" {
		q.Set("before", before)
	}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out chat.HistoryPage
	err := c.call(ctx, http.MethodGet, "/api/threads/"+esc(threadID)+"/messages", q, nil, &out)
	return out, err
}

// The bodies of the commands, shared by HTTP (where the ids in the path
// are left out) and WebSocket (where they are fields).

type startRunBody struct {
	ThreadID               string  `json:"thread_id,omitempty"`
	ExpectedStateVersion   int64   `json:"expected_state_version"`
	ResumeFromCheckpointID string  `json:"resume_from_checkpoint_id,omitempty"`
	UserMessage            *string `json:"user_message,omitempty"`
	ClientRequestID        string  `json:"client_request_id,omitempty"`
}

func (r StartRunRequest) body(ws bool) startRunBody {
	b := startRunBody{ExpectedStateVersion: r.ExpectedStateVersion,
		ResumeFromCheckpointID: r.ResumeFromCheckpointID, ClientRequestID: r.ClientRequestID}
	if r.UserMessage != "" {
		b.UserMessage = &r.UserMessage
	}
	if ws {
		b.ThreadID = r.ThreadID
	}
	return b
}

type cancelBody struct {
	RunID                string `json:"run_id,omitempty"`
	Reason               string `json:"reason,omitempty"`
	ExpectedStateVersion int64  `json:"expected_state_version,omitempty"`
}

type fragmentBody struct {
	ThreadID             string `json:"thread_id,omitempty"`
	MessageID            string `json:"message_id"`
	LastSeq              int64  `json:"last_seq"`
	ExpectedStateVersion int64  `json:"expected_state_version"`
}

type draftBody struct {
	ThreadID             string `json:"thread_id,omitempty"`
	MessageID            string `json:"message_id,omitempty"`
	ExpectedStateVersion int64  `json:"expected_state_version"`
}

type forkBody struct {
	ThreadID         string `json:"thread_id,omitempty"`
	FromCheckpointID string `json:"from_checkpoint_id"`
}

type checkoutBody struct {
	ThreadID             string `json:"thread_id,omitempty"`
	CheckpointID         string `json:"checkpoint_id"`
	ExpectedStateVersion int64  `json:"expected_state_version"`
}

type deleteThreadBody struct {
	ThreadID             string `json:"thread_id,omitempty"`
	ExpectedStateVersion int64  `json:"expected_state_version,omitempty"`
}

type decideBody struct {
	OperationID          string `json:"operation_id,omitempty"`
	ExpectedStateVersion int64  `json:"expected_state_version"`
}

// StartRun starts a run on a thread (POST /api/threads/{id}/runs): the
// user message, if any, is accepted and a run queued. It answers at once;
// follow the run on the thread's events.
func (c *Client) StartRun(ctx context.Context, r StartRunRequest) (chat.RunStartAck, error) {
	return callFor[chat.RunStartAck](ctx, c, http.MethodPost, "/api/threads/"+esc(r.ThreadID)+"/runs", r.body(false))
}

// CancelRun requests a run's cancel (POST /api/runs/{id}/cancel). The
// answer comes at once with the accepted state_version and the checkpoint
// to resume from; run.cancelled follows on the thread's events once the
// run stopped, with the receipt.
func (c *Client) CancelRun(ctx context.Context, r CancelRunRequest) (chat.CancelAck, error) {
	return callFor[chat.CancelAck](
		ctx,
		c,
		http.MethodPost,
		"/api/runs/"+esc(r.RunID)+"/cancel",
		cancelBody{Reason: r.Reason, ExpectedStateVersion: r.ExpectedStateVersion},
	)
}

// SaveFragment saves the streamed text of a message up to a delta seq as
// a fragment message (POST /api/threads/{id}/fragments).
func (c *Client) SaveFragment(ctx context.Context, r SaveFragmentRequest) (chat.FragmentSaved, error) {
	return callFor[chat.FragmentSaved](
		ctx,
		c,
		http.MethodPost,
		"/api/threads/"+esc(r.ThreadID)+"/fragments",
		fragmentBody{MessageID: r.MessageID, LastSeq: r.LastSeq, ExpectedStateVersion: r.ExpectedStateVersion},
	)
}

// StreamedText answers what SaveFragment would keep of a streamed message
// up to a delta seq, without saving anything (GET
// /api/threads/{id}/streamed/{message_id}?last_seq=N): compare its Content
// with what was displayed before offering to save it. A *Error with code
// fragment_unavailable says why the server does not hold it (its "cause"
// field: server_stopped, expired).
func (c *Client) StreamedText(
	ctx context.Context,
	threadID, messageID string,
	lastSeq int64,
) (chat.StreamedText, error) {
	var out chat.StreamedText
	err := c.call(ctx, http.MethodGet, "/api/threads/"+esc(threadID)+"/streamed/"+esc(messageID),
		url.Values{"last_seq": {strconv.FormatInt(lastSeq, 10)}}, nil, &out)
	return out, err
}

// DeleteDraft removes a fragment from the thread's history (POST
// /api/threads/{id}/drafts/{message_id}/delete).
func (c *Client) DeleteDraft(ctx context.Context, r DeleteDraftRequest) (chat.DraftDeleted, error) {
	return callFor[chat.DraftDeleted](
		ctx,
		c,
		http.MethodPost,
		"/api/threads/"+esc(r.ThreadID)+"/drafts/"+esc(r.MessageID)+"/delete",
		draftBody{ExpectedStateVersion: r.ExpectedStateVersion},
	)
}

// Fork copies a thread's state at one of its checkpoints into a new
// thread (POST /api/threads/{id}/fork); the original is untouched.
func (c *Client) Fork(ctx context.Context, threadID, fromCheckpointID string) (chat.ForkAck, error) {
	return callFor[chat.ForkAck](
		ctx,
		c,
		http.MethodPost,
		"/api/threads/"+esc(threadID)+"/fork",
		forkBody{FromCheckpointID: fromCheckpointID},
	)
}

// Checkout moves a thread's head to another of its checkpoints (POST
// /api/threads/{id}/head): switching branch.
func (c *Client) Checkout(ctx context.Context, r CheckoutRequest) (chat.CheckoutAck, error) {
	return callFor[chat.CheckoutAck](
		ctx,
		c,
		http.MethodPost,
		"/api/threads/"+esc(r.ThreadID)+"/head",
		checkoutBody{CheckpointID: r.CheckpointID, ExpectedStateVersion: r.ExpectedStateVersion},
	)
}

// DeleteThread deletes a thread (DELETE /api/threads/{id}), cancelling
// its run in flight first.
func (c *Client) DeleteThread(ctx context.Context, r DeleteThreadRequest) (chat.ThreadDeletedAck, error) {
	var body any
	if r.ExpectedStateVersion != 0 {
		body = deleteThreadBody{ExpectedStateVersion: r.ExpectedStateVersion}
	}
	return callFor[chat.ThreadDeletedAck](ctx, c, http.MethodDelete, "/api/threads/"+esc(r.ThreadID), body)
}

// ConfirmTool confirms a prepared consequential tool call (POST
// /api/operations/{id}/confirm): its commit goes ahead.
func (c *Client) ConfirmTool(
	ctx context.Context,
	operationID string,
	expectedStateVersion int64,
) (chat.ConfirmAck, error) {
	return c.decide(ctx, "confirm", operationID, expectedStateVersion)
}

// RejectTool rejects a prepared consequential tool call (POST
// /api/operations/{id}/reject): it is never made.
func (c *Client) RejectTool(
	ctx context.Context,
	operationID string,
	expectedStateVersion int64,
) (chat.ConfirmAck, error) {
	return c.decide(ctx, "reject", operationID, expectedStateVersion)
}

func (c *Client) decide(ctx context.Context, verb, operationID string, expected int64) (chat.ConfirmAck, error) {
	return callFor[chat.ConfirmAck](
		ctx,
		c,
		http.MethodPost,
		"/api/operations/"+esc(operationID)+"/"+verb,
		decideBody{ExpectedStateVersion: expected},
	)
}

// callFor is c.call of a request whose answer is one T.
func callFor[T any](ctx context.Context, c *Client, method, path string, body any) (T, error) {
	var out T
	err := c.call(ctx, method, path, nil, body, &out)
	return out, err
}
