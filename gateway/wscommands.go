package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"regexp"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// Commands of the WebSocket protocol. Each frame holds one JSON object with
// "type" and a client-chosen "id"; the fields of each command are those of
// the matching HTTP request, decoded just as strictly.
type wsEnvelope struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

type wsHello struct {
	wsEnvelope
	TabID *string `json:"tab_id"`
}

type wsSubscribe struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
	AfterSeq *int64  `json:"after_seq"`
}

type wsUnsubscribe struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
}

type wsRunStart struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
	startRunRequest
}

type wsRunCancel struct {
	wsEnvelope
	RunID *string `json:"run_id"`
	cancelRequest
}

type wsFragmentSave struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
	saveFragmentRequest
}

type wsDraftDelete struct {
	wsEnvelope
	ThreadID  *string `json:"thread_id"`
	MessageID *string `json:"message_id"`
	deleteDraftRequest
}

type wsFork struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
	forkRequest
}

type wsCheckout struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
	checkoutRequest
}

type wsDeleteThread struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
	deleteThreadRequest
}

type wsDecide struct {
	wsEnvelope
	OperationID *string `json:"operation_id"`
	decideRequest
}

// wsTarget is a command on one object: the name of the field that holds
// its id, and the id as sent (nil: absent).
type wsTarget interface {
	target() (field string, id *string)
}

func (cmd *wsRunStart) target() (string, *string)     { return "thread_id", cmd.ThreadID }
func (cmd *wsRunCancel) target() (string, *string)    { return "run_id", cmd.RunID }
func (cmd *wsFragmentSave) target() (string, *string) { return "thread_id", cmd.ThreadID }
func (cmd *wsDraftDelete) target() (string, *string)  { return "thread_id", cmd.ThreadID }
func (cmd *wsFork) target() (string, *string)         { return "thread_id", cmd.ThreadID }
func (cmd *wsCheckout) target() (string, *string)     { return "thread_id", cmd.ThreadID }
func (cmd *wsDeleteThread) target() (string, *string) { return "thread_id", cmd.ThreadID }
func (cmd *wsDecide) target() (string, *string)       { return "operation_id", cmd.OperationID }

// wsCommand performs one command on one object, as serveCommand does over
// HTTP: the frame decoded into a W, the object's id required, the domain
// command built by build for the connection's user (presence of the
// fields, then the command's Validate) and performed by do. Nothing is
// performed unless every check passed.
func wsCommand[W any, PW interface {
	*W
	wsTarget
}, Cmd, Ack any](ctx context.Context, data []byte, userID string, build func(cmd PW, userID, id string) (Cmd, error),
	do func(ctx context.Context, c Cmd) (Ack, error)) (any, error) {
	cmd := PW(new(W))
	if err := decodeJSON(data, cmd); err != nil {
		return nil, err
	}
	field, id := cmd.target()
	if err := required(field, id); err != nil {
		return nil, err
	}
	c, err := build(cmd, userID, *id)
	if err != nil {
		return nil, err
	}
	return do(ctx, c)
}

type subscribeAck struct {
	ThreadID     string `json:"thread_id"`
	Recovered    bool   `json:"recovered"`
	StateVersion int64  `json:"state_version"`
	LastSeq      int64  `json:"last_seq"`
}

var tabIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// MaxCommandIDBytes bounds a command's client-chosen "id", which every
// answer echoes in "re". A longer id is refused invalid_request without
// "re" (it is not echoed).
const MaxCommandIDBytes = 128

// command runs one client frame and queues exactly one ack or error for it
// (re = its id when readable), before any event it caused. Every frame is
// charged to the rate limits first, unreadable ones included (see admit).
func (c *wsConn) command(data []byte) {
	received := time.Now()
	log := c.hub.s.log
	var head map[string]json.RawMessage
	parsed := json.Unmarshal(data, &head) == nil && head != nil
	var re, typ string
	var idErr error
	if raw, ok := head["id"]; ok && json.Unmarshal(raw, &re) != nil {
		re, idErr = "", chat.Invalid("\"id\" must be a string")
	} else if len(re) > MaxCommandIDBytes {
		re, idErr = "", chat.Invalid("\"id\" is %d bytes; the maximum is %d", len(re), MaxCommandIDBytes)
	}
	typeOK := false
	if raw, ok := head["type"]; ok {
		typeOK = json.Unmarshal(raw, &typ) == nil
	}
	if err := c.admit(typ); err != nil {
		c.reply(errorFrame(re, err, log))
		return
	}
	switch {
	case !parsed:
		c.reply(errorFrame("", chat.Invalid("a frame must hold one JSON object with \"type\" and \"id\""), log))
		return
	case idErr != nil:
		c.reply(errorFrame("", idErr, log))
		return
	case !typeOK:
		c.reply(errorFrame(re, chat.Invalid("\"type\" is required and must be a string"), log))
		return
	case re == "":
		c.reply(errorFrame("", chat.Invalid("\"id\" is required: every command needs a client-chosen id"), log))
		return
	}
	c.hold()
	var extra func()
	var ack any
	var err error
	ended := false
	shallow(func() {
		// A session or token ended while the connection was open: the
		// command is not run, the connection closes with 1008. The check
		// may answer from the authenticator's cache: an end written by
		// another process is seen within its cache time (1 s), one
		// through this process at once; the writer re-checks the store
		// every ping interval, also for connections that only listen.
		if err = c.hub.s.auth.RevalidateCached(c.ctx, c.principal); err != nil {
			ended = chat.ErrorCode(err) == chat.CodeUnauthorized
			return
		}
		ack, err = c.dispatch(typ, data, &extra)
	})
	if ended {
		c.mu.Lock()
		c.holding = false
		c.closeLocked(closeAuthEnded, closeAuthEndedReason) // drops what was held
		c.mu.Unlock()
		return
	}
	var frame []byte
	if err != nil {
		frame, extra = errorFrame(re, err, log), nil
	} else {
		frame = ackFrame(re, ack)
		if typ == "run.cancel" {
			c.hub.s.metrics.CancelAcked(transportWebSocket, time.Since(received))
		}
	}
	// A cancel's answer is the control plane: it goes ahead of the events
	// already queued for a tab that is behind (they were queued before
	// the cancel was read, so none of them is caused by it).
	c.release(frame, extra, typ == "run.cancel")
}

// admit charges one frame of type typ ("" when unreadable) to the rate
// limits: run.cancel to its user's cancel reserve only; anything else to
// this connection's bucket, then to its user's command bucket (the
// connection's token is given back when the user's bucket refuses). It
// returns the rate_limited error to answer with, or nil.
func (c *wsConn) admit(typ string) error {
	limits := c.hub.s.limits
	if typ == "run.cancel" {
		err := limits.take(c.user, true)
		if err != nil {
			c.hub.s.metrics.RateLimited(limitCancels)
		}
		return err
	}
	now := c.hub.cfg.Now()
	c.mu.Lock()
	ok := c.limiter.allow(now)
	wait := c.limiter.retryAfter()
	c.mu.Unlock()
	if !ok {
		c.hub.s.metrics.RateLimited(limitConnCommands)
		secs := retrySeconds(wait)
		return chat.Errorf(chat.CodeRateLimited, "too many commands on this connection: wait %d s and retry this one", secs).With("retry_after_seconds", secs)
	}
	if err := limits.take(c.user, false); err != nil {
		c.mu.Lock()
		c.limiter.refund()
		c.mu.Unlock()
		c.hub.s.metrics.RateLimited(limitUserCommands)
		return err
	}
	return nil
}

// dispatch decodes and runs one command. A subscribe also returns, in
// extra, what to queue right after its ack (replay or snapshot).
func (c *wsConn) dispatch(typ string, data []byte, extra *func()) (any, error) {
	ctx := c.ctx
	s := c.hub.s
	switch typ {
	case "hello":
		var cmd wsHello
		if err := decodeJSON(data, &cmd); err != nil {
			return nil, err
		}
		if cmd.TabID == nil || !tabIDPattern.MatchString(*cmd.TabID) {
			if cmd.TabID != nil && len(*cmd.TabID) > chat.MaxTabIDBytes {
				return nil, chat.Invalid("tab_id is %d bytes; the maximum is %d (letters, digits or . _ : -)", len(*cmd.TabID), chat.MaxTabIDBytes)
			}
			return nil, chat.Invalid("tab_id is required: 1 to %d letters, digits or . _ : -", chat.MaxTabIDBytes)
		}
		c.mu.Lock()
		c.tab = *cmd.TabID
		c.mu.Unlock()
		return map[string]string{"connection_id": c.id}, nil

	case "subscribe":
		var cmd wsSubscribe
		if err := decodeJSON(data, &cmd); err != nil {
			return nil, err
		}
		if err := required("thread_id", cmd.ThreadID); err != nil {
			return nil, err
		}
		if cmd.AfterSeq != nil && *cmd.AfterSeq < 0 {
			return nil, chat.Invalid("after_seq must be 0 or more (omit it to start from a snapshot)")
		}
		return c.subscribe(*cmd.ThreadID, cmd.AfterSeq, extra)

	case "unsubscribe":
		var cmd wsUnsubscribe
		if err := decodeJSON(data, &cmd); err != nil {
			return nil, err
		}
		if err := required("thread_id", cmd.ThreadID); err != nil {
			return nil, err
		}
		c.mu.Lock()
		_, watched := c.subs[*cmd.ThreadID]
		delete(c.subs, *cmd.ThreadID)
		delete(c.lostWhileSubscribing, *cmd.ThreadID)
		c.mu.Unlock()
		if watched {
			s.limits.unwatch(c.user, 1)
		}
		s.feed.Remove(*cmd.ThreadID, c)
		return struct{}{}, nil

	case "run.start":
		return wsCommand(ctx, data, c.user, (*wsRunStart).command, s.runs.StartRun)

	case "run.cancel":
		return wsCommand(ctx, data, c.user, func(cmd *wsRunCancel, userID, runID string) (chat.CancelRun, error) {
			return cmd.command(userID, runID, c.requestedBy())
		}, s.runs.CancelRun)

	case "fragment.save":
		return wsCommand(ctx, data, c.user, (*wsFragmentSave).command, s.store.SaveFragment)

	case "draft.delete":
		return wsCommand(ctx, data, c.user, func(cmd *wsDraftDelete, userID, threadID string) (chat.DeleteDraft, error) {
			if err := required("message_id", cmd.MessageID); err != nil {
				return chat.DeleteDraft{}, err
			}
			return cmd.command(userID, threadID, *cmd.MessageID)
		}, s.store.DeleteDraft)

	case "thread.fork":
		return wsCommand(ctx, data, c.user, (*wsFork).command, s.forkThread)

	case "thread.checkout":
		return wsCommand(ctx, data, c.user, (*wsCheckout).command, s.store.Checkout)

	case "thread.delete":
		return wsCommand(ctx, data, c.user, func(cmd *wsDeleteThread, userID, threadID string) (chat.DeleteThread, error) {
			return cmd.command(userID, threadID, c.requestedBy())
		}, s.runs.DeleteThread)

	case "tool.confirm", "tool.reject":
		return wsCommand(ctx, data, c.user, func(cmd *wsDecide, userID, operationID string) (chat.Decide, error) {
			return cmd.command(userID, operationID, typ == "tool.confirm")
		}, s.runs.DecideOperation)

	case "queue.add", "queue.update", "queue.remove", "queue.resume":
		return c.queueCommand(typ, data)
	}
	return nil, chat.Invalid("unknown command type %s: see the protocol's command list", quoteShort(typ))
}

// subscribe starts delivering a thread's live events to this connection
// before reading what it missed, so nothing falls between the two; the
// seq filter in queueEventLocked drops what both carry.
func (c *wsConn) subscribe(threadID string, after *int64, extra *func()) (any, error) {
	s := c.hub.s
	c.mu.Lock()
	_, already := c.subs[threadID]
	if !already {
		if len(c.subs) >= c.hub.cfg.MaxSubscriptions {
			c.mu.Unlock()
			s.metrics.RateLimited(limitSubscriptions)
			return nil, chat.Errorf(chat.CodeRateLimited, "this connection already watches %d threads: unsubscribe from one first", len(c.subs))
		}
		if err := s.limits.watch(c.user); err != nil {
			c.mu.Unlock()
			s.metrics.RateLimited(limitSubscriptions)
			return nil, err
		}
	}
	c.subs[threadID] = -1
	c.mu.Unlock()
	s.feed.Add(threadID, c)

	from := int64(-1)
	if after != nil {
		from = *after
	}
	got, err := s.catchUp(c.ctx, c.user, threadID, from)
	if err != nil {
		c.mu.Lock()
		delete(c.subs, threadID)
		delete(c.lostWhileSubscribing, threadID)
		c.mu.Unlock()
		s.limits.unwatch(c.user, 1)
		s.feed.Remove(threadID, c)
		return nil, err
	}
	frames := make([][]byte, len(got.events))
	for i, ev := range got.events {
		frames[i] = ev.Raw
	}
	*extra = func() { // runs under c.mu, right after the ack is queued
		if _, ok := c.subs[threadID]; !ok {
			return
		}
		c.queueReplayLocked(frames)
		c.subs[threadID] = got.lastSeq
		c.settleLossLocked(threadID, got.lastSeq)
	}
	return subscribeAck{ThreadID: threadID, Recovered: got.recovered, StateVersion: got.stateVersion, LastSeq: got.lastSeq}, nil
}

// required refuses a missing, empty or over-long id field.
func required(field string, v *string) error {
	if v == nil {
		return chat.Invalid("%s is required", field)
	}
	return chat.CheckID(field, *v)
}

func (c *wsConn) requestedBy() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tab != "" {
		return "tab:" + c.tab
	}
	return "tab:" + c.id
}

// ackFrame encodes {"type":"ack","re":…} followed by the ack's fields.
func ackFrame(re string, body any) []byte {
	head, _ := json.Marshal(struct {
		Type string `json:"type"`
		Re   string `json:"re"`
	}{"ack", re})
	b, err := json.Marshal(body)
	if err != nil || len(b) < 2 || b[0] != '{' || string(b) == "{}" {
		return head
	}
	return append(append(head[:len(head)-1:len(head)-1], ','), b[1:]...)
}

// errorFrame encodes the protocol's error object with re (omitted when the
// frame had no readable id).
func errorFrame(re string, err error, log *slog.Logger) []byte {
	_, body := ErrorBody(err, log)
	if re != "" {
		body["re"] = re
	}
	b, _ := json.Marshal(body)
	return bytes.TrimSpace(b)
}

// shallow runs f on a short-lived goroutine and waits for it. Commands and
// credential re-checks reach the store and the engine (deep SQLite call
// chains); run on a connection's own long-lived goroutine (a WebSocket's
// reader or writer, an event stream's handler), they would grow its
// stack, which shrinks back only at a garbage collection (rare on an idle
// server: the runtime forces one every two minutes) — with a thousand
// tabs, megabytes. A panic is carried back to the caller, where net/http's
// per-connection recovery sees it as before.
func shallow(f func()) {
	done := make(chan struct{})
	var panicked any
	go func() {
		defer close(done)
		defer func() { panicked = recover() }()
		f()
	}()
	<-done
	if panicked != nil {
		panic(panicked)
	}
}
