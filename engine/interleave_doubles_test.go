// Doubles for TestInterleavings: a model whose every chunk waits for the
// scheduler, and a store that cancels once at a chosen boundary.

package engine_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/model"
)

// ---------------------------------------------------------------------------
// The gated model.

// ilWait says that stream (numbered from 1 in creation order) waits for the
// token of chunk; prev is the text of the chunk before it ("" for none).
type ilWait struct {
	stream, chunk int
	prev          string
	last          bool // chunk is the stream's last
}

// ilModel streams a user turn of nText unique text chunks, then (when the
// request offers it) one tool call; a turn after a tool result streams
// nAnswer chunks. Every chunk waits for a token on gate; before waiting,
// the stream reports on waits where it stands.
type ilModel struct {
	nText, nAnswer int
	tool           string
	args           []byte

	gate  chan struct{}
	waits chan ilWait

	mu      sync.Mutex
	streams int
}

func (m *ilModel) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	m.mu.Lock()
	m.streams++
	n := m.streams
	m.mu.Unlock()
	var chunks []model.Chunk
	if len(req.Messages) > 0 && req.Messages[len(req.Messages)-1].Role == model.RoleTool {
		for i := range m.nAnswer {
			chunks = append(chunks, model.Chunk{Text: fmt.Sprintf("s%dA%d ", n, i)})
		}
	} else {
		for i := range m.nText {
			chunks = append(chunks, model.Chunk{Text: fmt.Sprintf("s%dT%d ", n, i)})
		}
		if m.tool != "" && slices.ContainsFunc(req.Tools, func(s model.ToolSpec) bool { return s.Name == m.tool }) {
			chunks = append(chunks, model.Chunk{Call: &model.ToolCall{ID: "call_1", Name: m.tool, Arguments: m.args}})
		}
	}
	return &ilStream{m: m, n: n, ctx: ctx, chunks: chunks, closed: make(chan struct{})}, nil
}

func (m *ilModel) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.streams
}

type ilStream struct {
	m         *ilModel
	n, i      int
	ctx       context.Context
	chunks    []model.Chunk
	closed    chan struct{}
	closeOnce sync.Once
}

func (s *ilStream) Next(ctx context.Context) (model.Chunk, error) {
	if s.i >= len(s.chunks) {
		return model.Chunk{}, model.EOF
	}
	w := ilWait{stream: s.n, chunk: s.i, last: s.i == len(s.chunks)-1}
	if s.i > 0 {
		w.prev = s.chunks[s.i-1].Text
	}
	select {
	case s.m.waits <- w:
	case <-ctx.Done():
		return model.Chunk{}, ctx.Err()
	case <-s.ctx.Done():
		return model.Chunk{}, s.ctx.Err()
	}
	if err := waitGate(ctx, s.ctx, s.closed, s.m.gate, nil); err != nil {
		return model.Chunk{}, err
	}
	c := s.chunks[s.i]
	s.i++
	return c, nil
}

func (s *ilStream) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return nil
}

// ---------------------------------------------------------------------------
// A store that cancels at a chosen boundary.

// ilStore is a hookStore-style wrapper: once, at the chosen point of the
// chosen run, it cancels through the engine from the worker's goroutine,
// just before (or, for "after-publish", just after) the store call.
type ilStore struct {
	engine.Store

	mu      sync.Mutex
	runID   string
	point   string // append, before-publish, after-publish, committing, record, complete
	nth     int    // for append: the nth AppendDeltas call of the run
	appends int
	fired   bool
	inHand  int64 // characters of the batch the append hook stopped
	fire    func(point string)

	busy atomic.Int32  // worker calls inside this wrapper (hooks included)
	idle chan struct{} // a call left the wrapper
}

// enter and leave bracket a wrapped call: the seed judges the engine at
// rest only while no worker is inside one (a hook may be cancelling).
func (s *ilStore) enter() { s.busy.Add(1) }

func (s *ilStore) leave() {
	s.busy.Add(-1)
	select {
	case s.idle <- struct{}{}:
	default:
	}
}

func (s *ilStore) hit(runID, point string, texts []string) {
	s.mu.Lock()
	match := !s.fired && s.point == point && runID == s.runID
	if point == "append" && runID == s.runID {
		s.appends++
		match = match && s.appends == s.nth
	}
	if match {
		s.fired = true
		for _, t := range texts {
			s.inHand += int64(utf8.RuneCountInString(t))
		}
	}
	fire := s.fire
	s.mu.Unlock()
	if match && fire != nil {
		fire(point)
	}
}

func (s *ilStore) AppendDeltas(ctx context.Context, lease chat.Lease, messageID string, texts []string) error {
	runID := lease.RunID
	s.enter()
	defer s.leave()
	s.hit(runID, "append", texts)
	return s.Store.AppendDeltas(ctx, lease, messageID, texts)
}

func (s *ilStore) PublishStep(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	runID := lease.RunID
	s.enter()
	defer s.leave()
	s.hit(runID, "before-publish", nil)
	err := s.Store.PublishStep(ctx, lease, out)
	if err == nil {
		s.hit(runID, "after-publish", nil)
	}
	return err
}

// CompleteWith is split into PublishStep and Complete here, each with its
// hook points, so the interleavings include a cancel or a crash between
// the two: a superset of the engine's one transaction (a database an
// earlier version wrote may hold a run published and not completed).
func (s *ilStore) CompleteWith(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	if err := s.PublishStep(ctx, lease, out); err != nil {
		return err
	}
	return s.Complete(ctx, lease)
}

func (s *ilStore) SetOperationPhase(ctx context.Context, lease chat.Lease, opID, phase, outcome string, needRunning bool) error {
	runID := lease.RunID
	s.enter()
	defer s.leave()
	if phase == chat.PhaseCommitting {
		s.hit(runID, "committing", nil)
	}
	return s.Store.SetOperationPhase(ctx, lease, opID, phase, outcome, needRunning)
}

func (s *ilStore) RecordToolResult(ctx context.Context, lease chat.Lease, opID string, out chat.ToolOutcome) error {
	runID := lease.RunID
	s.enter()
	defer s.leave()
	s.hit(runID, "record", nil)
	return s.Store.RecordToolResult(ctx, lease, opID, out)
}

func (s *ilStore) Complete(ctx context.Context, lease chat.Lease) error {
	runID := lease.RunID
	s.enter()
	defer s.leave()
	s.hit(runID, "complete", nil)
	return s.Store.Complete(ctx, lease)
}
