package bus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/honestcancel/gateway/chat"
)

// Requests for one process (a run lease owner, NATSConfig.Holder), on a
// subject of its own, answered by that process only:
//
//   - yield (store.StreamPeers): write your pending deltas of a thread and
//     give its reserved seqs back, so that I can write the thread;
//   - cancel (engine.CancelForwarder): accept this cancel of a run you
//     execute, as if a tab of yours had sent it — your transaction writes
//     your pending deltas first and your worker stops at once, where a
//     cancel written here would wait for you to yield the thread and then
//     for a wake-up.
//
// A process that is gone answers at once (NATS reports nobody listens on
// its subject), as does this bus while it is not connected: the caller
// then does the work itself, on the database (store.Store writes past a
// reservation nobody yields, the engine accepts the cancel here).

const (
	// maxHolderRequests bounds the requests answered at once.
	maxHolderRequests = 16
	// holderAnswerTimeout bounds the work behind one answer.
	holderAnswerTimeout = 5 * time.Second
)

// holderRequest is a request's payload; holderAnswer its reply's.
type holderRequest struct {
	Op       string          `json:"op"` // "yield" or "cancel"
	ThreadID string          `json:"thread_id,omitempty"`
	Cancel   *chat.CancelRun `json:"cancel,omitempty"`
}

type holderAnswer struct {
	Error  *answerError    `json:"error,omitempty"`
	Cancel *chat.CancelAck `json:"cancel,omitempty"`
}

// answerError carries a *chat.Error (Code set) or any other failure.
type answerError struct {
	Code    string         `json:"code,omitempty"`
	Message string         `json:"message"`
	Fields  map[string]any `json:"fields,omitempty"`
}

// holderSubject is the subject a process answers on: a hash of its lease
// owner name, which need not be a NATS token.
func (b *NATS) holderSubject(holder string) string {
	sum := sha256.Sum256([]byte(holder))
	return b.holderS + hex.EncodeToString(sum[:12])
}

// ask sends req to holder and waits for its answer until ctx ends.
func (b *NATS) ask(ctx context.Context, holder string, req holderRequest) (holderAnswer, error) {
	var ans holderAnswer
	if !b.nc.IsConnected() {
		// Cut off from NATS (it restarts, the network splits): the holder
		// cannot be asked, and the caller is not kept waiting for the
		// reconnection.
		return ans, errors.New("not connected to NATS")
	}
	data, err := json.Marshal(req)
	if err != nil {
		return ans, err
	}
	m, err := b.nc.RequestWithContext(ctx, b.holderSubject(holder), data)
	if err != nil {
		return ans, err
	}
	if err := json.Unmarshal(m.Data, &ans); err != nil {
		return ans, fmt.Errorf("unreadable answer: %w", err)
	}
	if e := ans.Error; e != nil {
		if e.Code != "" {
			return ans, &chat.Error{Code: e.Code, Message: e.Message, Fields: e.Fields}
		}
		return ans, errors.New(e.Message)
	}
	return ans, nil
}

// YieldStream asks the process holder to yield the thread (its OnYield)
// and waits for its answer until ctx ends.
func (b *NATS) YieldStream(ctx context.Context, holder, threadID string) error {
	if _, err := b.ask(ctx, holder, holderRequest{Op: "yield", ThreadID: threadID}); err != nil {
		return fmt.Errorf("ask %s to yield thread %s: %w", holder, threadID, err)
	}
	return nil
}

// ForwardCancel hands a cancel to the process executing the run (its
// OnCancelRun) and returns that process's answer. A refusal of the
// cancel itself (not found, not active …) is its *chat.Error; any other
// error means the holder did not answer.
func (b *NATS) ForwardCancel(ctx context.Context, holder string, p chat.CancelRun) (chat.CancelAck, error) {
	ans, err := b.ask(ctx, holder, holderRequest{Op: "cancel", Cancel: &p})
	var ce *chat.Error
	if errors.As(err, &ce) {
		return chat.CancelAck{}, ce
	}
	if err != nil {
		return chat.CancelAck{}, fmt.Errorf("forward the cancel of %s to %s: %w", p.RunID, holder, err)
	}
	if ans.Cancel == nil {
		return chat.CancelAck{}, fmt.Errorf("forward the cancel of %s to %s: the answer has no ack", p.RunID, holder)
	}
	return *ans.Cancel, nil
}

// receiveHolderRequests answers the requests other instances send this
// process, each in a goroutine of its own (at most maxHolderRequests at
// once; the rest wait in the subscription's channel).
func (b *NATS) receiveHolderRequests() {
	slots := make(chan struct{}, maxHolderRequests)
	for {
		select {
		case <-b.ctx.Done():
			return
		case m := <-b.hCh:
			select {
			case slots <- struct{}{}:
			case <-b.ctx.Done():
				return
			}
			b.wg.Go(func() {
				defer func() { <-slots }()
				b.answer(m)
			})
		}
	}
}

func (b *NATS) answer(m *nats.Msg) {
	var req holderRequest
	var ans holderAnswer
	var err error
	ctx, cancel := context.WithTimeout(b.ctx, holderAnswerTimeout)
	defer cancel()
	switch jerr := json.Unmarshal(m.Data, &req); {
	case jerr != nil:
		err = fmt.Errorf("unreadable request: %w", jerr)
	case req.Op == "yield" && b.cfg.OnYield != nil:
		err = b.cfg.OnYield(ctx, req.ThreadID)
	case req.Op == "cancel" && req.Cancel != nil && b.cfg.OnCancelRun != nil:
		var ack chat.CancelAck
		if ack, err = b.cfg.OnCancelRun(ctx, *req.Cancel); err == nil {
			ans.Cancel = &ack
		}
	default:
		err = fmt.Errorf("this process does not answer %q requests", req.Op)
	}
	if err != nil {
		var ce *chat.Error
		if errors.As(err, &ce) {
			ans.Error = &answerError{Code: ce.Code, Message: ce.Message, Fields: ce.Fields}
		} else {
			b.log.Warn("answer a request of another instance failed", "op", req.Op, "err", err)
			ans.Error = &answerError{Message: err.Error()}
		}
	}
	data, _ := json.Marshal(ans)
	if err := m.Respond(data); err != nil && b.ctx.Err() == nil {
		b.log.Warn("answer a request of another instance failed", "op", req.Op, "err", err)
	}
}
