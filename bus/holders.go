package bus

import (
	"bytes"
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
// The holder confirms receipt of a request at once, on the request's reply
// subject, and answers on it when the work is done. The asker takes over
// (does the work itself, on the database: store.Store writes past a
// reservation nobody yields, the engine accepts the cancel here) only from
// a process that does not confirm receipt within ReceiptTimeout — gone
// (NATS reports at once that nobody listens on its subject), stopped,
// cut off — or does not answer within the asker's own bound; this bus
// fails at once while it is not connected. A holder that is only slow
// (its writer queue is long under load) is waited for: taking over from it
// would do the same work twice, on both instances' saturated writers, and
// make it slower still (seen in the cluster benchmark: cancels that
// waited 500 ms for a busy holder were accepted again by the asker, which
// then asked the same holder to yield, stalling both for seconds).

const (
	// maxHolderRequests bounds the requests answered at once;
	// maxHolderWaiting the requests received and not yet answered.
	maxHolderRequests = 16
	maxHolderWaiting  = 1024
	// holderAnswerTimeout bounds the work behind one answer.
	holderAnswerTimeout = 5 * time.Second
	// ReceiptTimeout bounds the wait for a holder to confirm that it
	// received a request.
	ReceiptTimeout = 500 * time.Millisecond
)

// receipt is what a holder sends first on a request's reply subject.
var receipt = []byte(`{"received":true}`)

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

// ask sends req to holder and waits for its answer until ctx ends; it
// fails sooner when nobody listens for holder, or when the holder does not
// confirm receipt within ReceiptTimeout.
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
	inbox := b.nc.NewRespInbox()
	replies := make(chan *nats.Msg, 3) // a receipt, an answer, a status
	sub, err := b.nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return ans, err
	}
	defer sub.Unsubscribe()
	if err := b.nc.PublishRequest(b.holderSubject(holder), inbox, data); err != nil {
		return ans, err
	}
	noReceipt := time.NewTimer(ReceiptTimeout)
	defer noReceipt.Stop()
	for {
		select {
		case <-ctx.Done():
			return ans, fmt.Errorf("no answer in time: %w", context.Cause(ctx))
		case <-noReceipt.C:
			return ans, fmt.Errorf("no receipt within %s: the process is stalled or cut off", ReceiptTimeout)
		case m := <-replies:
			if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
				return ans, nats.ErrNoResponders
			}
			if bytes.Equal(m.Data, receipt) {
				noReceipt.Stop()
				continue
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
	}
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

// receiveHolderRequests confirms receipt of each request other instances
// send this process at once, then answers it in a goroutine of its own (at
// most maxHolderRequests at once; at most maxHolderWaiting received and not
// yet answered: beyond it requests wait in the subscription's channel,
// unconfirmed, and their askers take over).
func (b *NATS) receiveHolderRequests() {
	running := make(chan struct{}, maxHolderRequests)
	waiting := make(chan struct{}, maxHolderWaiting)
	for {
		select {
		case <-b.ctx.Done():
			return
		case m := <-b.hCh:
			select {
			case waiting <- struct{}{}:
			case <-b.ctx.Done():
				return
			}
			if err := m.Respond(receipt); err != nil && b.ctx.Err() == nil {
				b.log.Warn("confirm a request of another instance failed", "err", err)
			}
			b.wg.Go(func() {
				defer func() { <-waiting }()
				select {
				case running <- struct{}{}:
				case <-b.ctx.Done():
					return
				}
				defer func() { <-running }()
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
	h := b.handlers.Load()
	switch jerr := json.Unmarshal(m.Data, &req); {
	case jerr != nil:
		err = fmt.Errorf("unreadable request: %w", jerr)
	case h == nil:
		err = errors.New("this instance is still starting")
	case req.Op == "yield" && h.OnYield != nil:
		err = h.OnYield(ctx, req.ThreadID)
	case req.Op == "cancel" && req.Cancel != nil && h.OnCancelRun != nil:
		var ack chat.CancelAck
		if ack, err = h.OnCancelRun(ctx, *req.Cancel); err == nil {
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
