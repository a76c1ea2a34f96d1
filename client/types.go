package client

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// FromSnapshot, as the position of Conn.Subscribe or Client.Events, asks
// for the thread's current state first (a thread.snapshot event, whose Gap
// is nil), then the live events. Any position >= 0 asks for every event
// after that seq instead (0: from the thread's start).
const FromSnapshot int64 = -1

// Event is one event of a thread's stream (docs/protocol.md, "Events"), as
// delivered by a Subscription or a Stream. The common fields are decoded;
// Body holds the type's own fields.
type Event struct {
	Type     string // chat.Event… (run.started, message.delta, …)
	ThreadID string
	Seq      int64
	TS       int64 // server time the event was created, Unix milliseconds
	// StateVersion is the thread's state_version after a durable event
	// (every type but message.delta and thread.snapshot), and the
	// snapshot's on thread.snapshot; 0 on a delta.
	StateVersion int64
	// RunID is set on run.*, message.delta and tool.* events and on
	// message.published and checkpoint.created events a run produced.
	RunID string
	// Body is the decoded type-specific fields, a pointer to the chat type
	// of the event:
	//
	//	run.started               *chat.RunStartedBody
	//	message.delta             *chat.MessageDeltaBody
	//	message.published         *chat.MessagePublishedBody
	//	checkpoint.created        *chat.CheckpointCreatedBody
	//	tool.prepared/updated     *chat.ToolBody
	//	run.waiting_confirmation  *chat.RunWaitingConfirmationBody
	//	run.cancel_requested      *chat.RunCancelRequestedBody
	//	run.cancelling            *chat.RunCancellingBody
	//	run.cancelled             *chat.RunCancelledBody
	//	run.failed                *chat.RunFailedBody
	//	message.deleted           *chat.MessageDeletedBody
	//	thread.head_moved         *chat.ThreadHeadMovedBody
	//	queue.updated             *chat.QueueUpdatedBody
	//	thread.snapshot           *chat.Snapshot
	//
	// and nil for run.completed, thread.deleted and types this client does
	// not know (read Raw for those).
	Body any
	// Gap is set on a thread.snapshot that stands for events the server
	// could no longer replay (docs/protocol.md invariant 8: deltas purged after
	// their TTL, or lost in a crash): the events with seq in
	// (Gap.After, Gap.Through] were not delivered one by one; the snapshot
	// holds their effect. Drop any state derived from earlier events
	// (partial delta text above all) and start again from the snapshot.
	Gap *Gap
	// Raw is the event's JSON as the server sent it.
	Raw json.RawMessage
	// Received is when the client read the event: on a Subscription, when
	// the Conn's reader goroutine read the WebSocket frame holding it
	// (before it waited in the Subscription's queue for Next); on a
	// Stream, when Next parsed it. Latency measured against it leaves out
	// the time the caller took to call Next.
	Received time.Time
	// Replayed is set, on a Subscription's events, on one the server sent
	// as the catch-up of a subscribe (the first one, or one the Conn made
	// again after a reconnection or a lag): its seq is at most the last_seq
	// of that subscribe's ack, so it happened before the (re)subscribe and
	// arrives late. Events sent live leave it false, and so does a Stream.
	Replayed bool
}

// Gap is a range of seqs replaced by a snapshot (see Event.Gap).
type Gap struct {
	After   int64 // the last seq delivered (or asked for) before the gap
	Through int64 // the snapshot's seq: the last one it reflects
}

// Durable reports whether the event is a durable one: persisted, and
// bumping the thread's state_version (all but message.delta and
// thread.snapshot).
func (e Event) Durable() bool {
	return e.Type != chat.EventMessageDelta && e.Type != chat.EventThreadSnapshot
}

// Delta returns the body of a message.delta event, or nil for any other.
func (e Event) Delta() *chat.MessageDeltaBody { return bodyAs[chat.MessageDeltaBody](e) }

// Cancelled returns the receipt of a run.cancelled event, or nil for any
// other.
func (e Event) Cancelled() *chat.RunCancelledBody { return bodyAs[chat.RunCancelledBody](e) }

// Published returns the body of a message.published event, or nil.
func (e Event) Published() *chat.MessagePublishedBody { return bodyAs[chat.MessagePublishedBody](e) }

// Snapshot returns the body of a thread.snapshot event, or nil.
func (e Event) Snapshot() *chat.Snapshot { return bodyAs[chat.Snapshot](e) }

// bodyAs is e.Body as a *T, or nil when it holds another type.
func bodyAs[T any](e Event) *T {
	b, _ := e.Body.(*T)
	return b
}

func (e Event) String() string { return fmt.Sprintf("#%d %s", e.Seq, e.Type) }

// decodeEvent decodes one event object; raw is kept, not copied.
func decodeEvent(raw []byte) (Event, error) {
	var h chat.EventHeader
	if err := json.Unmarshal(raw, &h); err != nil {
		return Event{}, fmt.Errorf("client: unreadable event: %w", err)
	}
	return decodeEventHead(raw, h)
}

// decodeEventHead is decodeEvent of an event whose head is decoded.
func decodeEventHead(raw []byte, h chat.EventHeader) (Event, error) {
	if h.Type == "" || h.ThreadID == "" {
		return Event{}, fmt.Errorf("client: event without type or thread_id: %.200s", raw)
	}
	ev := Event{
		Type:         h.Type,
		ThreadID:     h.ThreadID,
		Seq:          h.Seq,
		TS:           h.TS,
		StateVersion: h.StateVersion,
		RunID:        h.RunID,
		Raw:          raw,
	}
	newBody, ok := eventBodies[h.Type]
	if !ok {
		return ev, nil
	}
	body := newBody()
	if err := json.Unmarshal(raw, body); err != nil {
		return Event{}, fmt.Errorf("client: unreadable %s event: %w", h.Type, err)
	}
	ev.Body = body
	return ev, nil
}

// eventBodies makes, for each event type with a Body, the chat type its
// fields decode into (see Event.Body).
var eventBodies = map[string]func() any{
	chat.EventRunStarted:             bodyOf[chat.RunStartedBody],
	chat.EventMessageDelta:           bodyOf[chat.MessageDeltaBody],
	chat.EventMessagePublished:       bodyOf[chat.MessagePublishedBody],
	chat.EventCheckpointCreated:      bodyOf[chat.CheckpointCreatedBody],
	chat.EventToolPrepared:           bodyOf[chat.ToolBody],
	chat.EventToolUpdated:            bodyOf[chat.ToolBody],
	chat.EventRunWaitingConfirmation: bodyOf[chat.RunWaitingConfirmationBody],
	chat.EventRunCancelRequested:     bodyOf[chat.RunCancelRequestedBody],
	chat.EventRunCancelling:          bodyOf[chat.RunCancellingBody],
	chat.EventRunCancelled:           bodyOf[chat.RunCancelledBody],
	chat.EventRunFailed:              bodyOf[chat.RunFailedBody],
	chat.EventMessageDeleted:         bodyOf[chat.MessageDeletedBody],
	chat.EventThreadHeadMoved:        bodyOf[chat.ThreadHeadMovedBody],
	chat.EventQueueUpdated:           bodyOf[chat.QueueUpdatedBody],
	chat.EventThreadSnapshot:         bodyOf[chat.Snapshot],
}

func bodyOf[T any]() any { return new(T) }

// StartRunRequest are the fields of run.start (POST
// /api/threads/{id}/runs).
type StartRunRequest struct {
	ThreadID string
	// ExpectedStateVersion is the state_version of the last durable event
	// applied (or of the snapshot read); a stale one is refused with
	// state_version_conflict.
	ExpectedStateVersion int64
	// ResumeFromCheckpointID is the checkpoint to continue from; "" = the
	// thread's head.
	ResumeFromCheckpointID string
	// UserMessage is the new user text (1–32768 bytes); "" sends none,
	// which re-runs the checkpoint's pending step ("Continue from the
	// saved point").
	UserMessage string
	// ClientRequestID, when set, makes the start safe to retry: a retry
	// with the same value returns the same run. A Conn resends a run.start
	// that has one when the connection drops before its answer.
	ClientRequestID string
}

// CancelRunRequest are the fields of run.cancel (POST
// /api/runs/{id}/cancel).
type CancelRunRequest struct {
	RunID string
	// Reason is recorded with the cancel; "" = user_requested.
	Reason string
	// ExpectedStateVersion is sent when not 0; a stale one never blocks a
	// cancel.
	ExpectedStateVersion int64
}

// SaveFragmentRequest are the fields of fragment.save (POST
// /api/threads/{id}/fragments): save the text of a streamed message up to
// a delta seq as a fragment.
type SaveFragmentRequest struct {
	ThreadID             string
	MessageID            string // the streamed message (its deltas' message_id)
	LastSeq              int64  // the last delta seq displayed
	ExpectedStateVersion int64
}

// DeleteDraftRequest are the fields of draft.delete (POST
// /api/threads/{id}/drafts/{message_id}/delete).
type DeleteDraftRequest struct {
	ThreadID             string
	MessageID            string // the fragment's id
	ExpectedStateVersion int64
}

// CheckoutRequest are the fields of thread.checkout (POST
// /api/threads/{id}/head): move the thread's head to another of its
// checkpoints.
type CheckoutRequest struct {
	ThreadID             string
	CheckpointID         string
	ExpectedStateVersion int64
}

// DeleteThreadRequest are the fields of thread.delete (DELETE
// /api/threads/{id}).
type DeleteThreadRequest struct {
	ThreadID string
	// ExpectedStateVersion is sent when not 0 (state versions start at
	// 1): a stale one is a state_version_conflict.
	ExpectedStateVersion int64
}

// ListThreadsOptions select a page of GET /api/threads.
type ListThreadsOptions struct {
	Limit  int    // 1–200; 0 = the server's default (50)
	Cursor string // a ThreadPage.NextCursor; "" = the first page
	Query  string // q: words to find in titles and message text
}

// ThreadPage is one page of the thread list, newest updated first.
type ThreadPage struct {
	Threads []chat.Thread
	// NextCursor asks for the next page; "" when this is the last.
	NextCursor string
}

// Checkpoints is a thread's checkpoints, oldest first, and its head.
type Checkpoints struct {
	HeadCheckpointID string            `json:"head_checkpoint_id"`
	Checkpoints      []chat.Checkpoint `json:"checkpoints"`
}

// SubscribeAck is the answer to subscribe.
type SubscribeAck struct {
	ThreadID string `json:"thread_id"`
	// Recovered is true when the events after the asked seq follow,
	// false when a thread.snapshot does.
	Recovered    bool  `json:"recovered"`
	StateVersion int64 `json:"state_version"`
	LastSeq      int64 `json:"last_seq"`
}

// Commander is the protocol's commands, which both transports carry with
// the same meaning: *Client over HTTP, *Conn over WebSocket (where a
// cancel is requested_by the tab). Both implementations are safe for
// concurrent use.
type Commander interface {
	StartRun(ctx context.Context, r StartRunRequest) (chat.RunStartAck, error)
	CancelRun(ctx context.Context, r CancelRunRequest) (chat.CancelAck, error)
	SaveFragment(ctx context.Context, r SaveFragmentRequest) (chat.FragmentSaved, error)
	DeleteDraft(ctx context.Context, r DeleteDraftRequest) (chat.DraftDeleted, error)
	Fork(ctx context.Context, threadID, fromCheckpointID string) (chat.ForkAck, error)
	Checkout(ctx context.Context, r CheckoutRequest) (chat.CheckoutAck, error)
	DeleteThread(ctx context.Context, r DeleteThreadRequest) (chat.ThreadDeletedAck, error)
	ConfirmTool(ctx context.Context, operationID string, expectedStateVersion int64) (chat.ConfirmAck, error)
	RejectTool(ctx context.Context, operationID string, expectedStateVersion int64) (chat.ConfirmAck, error)
}

var (
	_ Commander = (*Client)(nil)
	_ Commander = (*Conn)(nil)
)

// Stats counts what a Conn or a Stream did to keep its event streams
// exact. With a correct server, Duplicates, Jumps, Stray and Malformed
// stay 0, and so does Unanswered while no caller gives up waiting for an
// answer; Resyncs counts gaps the server reported (each one an Event.Gap
// delivered).
type Stats struct {
	Connects   int64 // connections made (the first one included)
	Resyncs    int64 // thread.snapshot events that replaced events (Event.Gap set)
	Duplicates int64 // events dropped because their seq was delivered already
	// Jumps counts seqs that skipped ahead without a snapshot (the server
	// lost an event on its way); each was repaired by resuming from the
	// last seq received, which the server replays.
	Jumps int64
	// Lagged counts times a Subscription's buffer filled because its
	// reader fell behind; it was resumed from its last seq once read.
	Lagged int64
	// Stray counts events of a thread the Conn does not subscribe to.
	Stray int64
	// Unanswered counts ack and error frames that answer no command in
	// flight (a command given up by its caller, or a frame the server
	// could not read: an error without re).
	Unanswered int64
	// Malformed counts server objects that were not readable JSON of the
	// protocol (they were dropped).
	Malformed int64
	// Early counts events of a thread a Conn received while the subscribe
	// that asked for them was not answered yet: the server answers a
	// subscribe before it sends the thread's events (docs/protocol.md), so
	// with a correct server it stays 0. They were delivered all the same.
	Early int64
	// LastAnomaly describes the last duplicate, jump, stray, unanswered,
	// malformed or early object ("" when none), for logs and test
	// failures.
	LastAnomaly string
	// Drops counts connections that ended by themselves (not by Close):
	// closed by the server, taken for dead after the idle timeout, or cut
	// by the network. Each was reconnected unless it ended the Conn or
	// Stream (see Err).
	Drops int64
	// LastDrop says why the last of them ended ("" when none): the
	// server's close code and reason ("closed by the server: 1013 …"),
	// the idle timeout, or the network's error.
	LastDrop string
}

// stats is Stats kept with atomics (the reader goroutine writes it while
// anyone reads it).
type stats struct {
	connects, resyncs, duplicates, jumps, lagged, stray, unanswered, malformed atomic.Int64
	early, drops                                                               atomic.Int64
	anomaly, lastDrop                                                          atomic.Pointer[string]
}

// dropped counts a connection that ended by itself, and why.
func (s *stats) dropped(why string) {
	s.drops.Add(1)
	s.lastDrop.Store(&why)
}

func (s *stats) note(counter *atomic.Int64, format string, args ...any) {
	counter.Add(1)
	msg := fmt.Sprintf(format, args...)
	s.anomaly.Store(&msg)
}

func (s *stats) snapshot() Stats {
	out := Stats{
		Connects: s.connects.Load(), Resyncs: s.resyncs.Load(), Duplicates: s.duplicates.Load(),
		Jumps: s.jumps.Load(), Lagged: s.lagged.Load(), Stray: s.stray.Load(),
		Unanswered: s.unanswered.Load(), Malformed: s.malformed.Load(), Early: s.early.Load(),
	}
	if p := s.anomaly.Load(); p != nil {
		out.LastAnomaly = *p
	}
	out.Drops = s.drops.Load()
	if p := s.lastDrop.Load(); p != nil {
		out.LastDrop = *p
	}
	return out
}

// backoff spaces reconnection attempts: min doubling up to max, each delay
// drawn from [d/2, d]. Owned by one goroutine.
type backoff struct {
	min, max time.Duration
	n        int
}

func (b *backoff) next() time.Duration {
	d := b.min << min(b.n, 20)
	if d <= 0 || d > b.max {
		d = b.max
	}
	b.n++
	return d/2 + rand.N(d/2+1)
}

func (b *backoff) reset() { b.n = 0 }

// sleep waits d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
