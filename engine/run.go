package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/model"
)

// storeTimeout bounds the writes a worker makes to settle its run after its
// own context ended.
const storeTimeout = 10 * time.Second

// execute owns one claimed run until it is settled: completed, failed,
// cancelled, or handed back to the queue on shutdown.
func (e *Engine) execute(run *chat.Run) {
	ctx, cancel := context.WithCancelCause(e.ctx)
	defer cancel(nil)
	// Register before the first read of the run: a cancel recorded after
	// that read finds the registration; one recorded before it is seen by
	// the read.
	e.mu.Lock()
	e.running[run.RunID] = cancel
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.running, run.RunID)
		e.mu.Unlock()
	}()

	log := e.log.With("run_id", run.RunID, "thread_id", run.ThreadID)
	unbuffered, err := e.generate(ctx, run.RunID)
	if err == nil {
		return
	}
	settle, stop := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer stop()
	var lost *chat.ErrNotRunning
	cause := context.Cause(ctx)
	switch {
	case errors.As(err, &lost) && !lost.Status.CancelAccepted():
		log.Warn("run taken from this worker", "status", lost.Status)
		return
	case errors.As(err, &lost), errors.Is(cause, errCancelRequested):
		if _, err := e.store.FinishCancel(settle, run.RunID, unbuffered); err != nil {
			log.Error("finish cancel", "err", err)
		}
	case errors.Is(cause, errShutdown):
		err := e.store.Release(settle, run.RunID, e.cfg.InstanceID)
		if errors.As(err, &lost) && lost.Status.CancelAccepted() {
			_, err = e.store.FinishCancel(settle, run.RunID, unbuffered)
		}
		if err != nil {
			log.Error("hand run back", "err", err)
		}
	default:
		log.Warn("run failed", "err", err)
		ferr := e.store.Fail(settle, run.RunID, e.cfg.InstanceID, userMessage(err))
		if errors.As(ferr, &lost) && lost.Status.CancelAccepted() {
			_, ferr = e.store.FinishCancel(settle, run.RunID, unbuffered)
		}
		if ferr != nil {
			log.Error("record failure", "err", ferr)
		}
	}
}

// generate runs the pending generate step: stream the model's reply into the
// stream buffer in batches, then publish it with its checkpoint and complete
// the run. The safe points are every batch (the write checks the run is
// still running under this lease) and the context (cancelled on a cancel
// wake-up). It returns how many received characters it never buffered.
func (e *Engine) generate(ctx context.Context, runID string) (int64, error) {
	in, err := e.store.RunInput(ctx, runID)
	if err != nil {
		return 0, err
	}
	if in.Run.Status != chat.RunRunning {
		return 0, &chat.ErrNotRunning{Status: in.Run.Status}
	}
	stream, err := e.model.Stream(ctx, modelRequest(in))
	if err != nil {
		return 0, err
	}
	streamCtx, stopStream := context.WithCancel(ctx)
	chunks := make(chan string, e.cfg.MaxBatch)
	var received atomic.Int64
	var pumpErr error
	var pump sync.WaitGroup
	pump.Go(func() {
		defer close(chunks)
		for {
			c, err := stream.Next(streamCtx)
			if err != nil {
				pumpErr = err
				return
			}
			if c.Text == "" {
				continue
			}
			received.Add(int64(utf8.RuneCountInString(c.Text)))
			select {
			case chunks <- c.Text:
			case <-streamCtx.Done():
				pumpErr = context.Cause(streamCtx)
				return
			}
		}
	})
	var buffered int64
	defer func() {
		stopStream()
		stream.Close()
		pump.Wait()
	}()
	unbuffered := func() int64 {
		stopStream()
		stream.Close()
		pump.Wait()
		return received.Load() - buffered
	}

	messageID := chat.NewID(chat.PrefixMessage)
	write := context.WithoutCancel(ctx)
	var full strings.Builder
	batch := make([]string, 0, e.cfg.MaxBatch)
	for {
		text, ok := <-chunks
		if !ok {
			break
		}
		batch = append(batch[:0], text)
	drain:
		for len(batch) < e.cfg.MaxBatch {
			select {
			case text, ok := <-chunks:
				if !ok {
					break drain
				}
				batch = append(batch, text)
			default:
				break drain
			}
		}
		if ctx.Err() != nil { // safe point: a cancel wake-up or shutdown
			return unbuffered(), ctx.Err()
		}
		if err := e.store.AppendDeltas(write, runID, e.cfg.InstanceID, messageID, batch, e.leaseUntil()); err != nil {
			return unbuffered(), err
		}
		for _, t := range batch {
			buffered += int64(utf8.RuneCountInString(t))
			full.WriteString(t)
		}
	}
	if !errors.Is(pumpErr, model.EOF) {
		return unbuffered(), pumpErr
	}
	if ctx.Err() != nil {
		return unbuffered(), ctx.Err()
	}
	if full.Len() == 0 {
		return 0, errors.New("the model returned an empty reply")
	}
	if _, err := e.store.Publish(write, runID, e.cfg.InstanceID, messageID, full.String()); err != nil {
		return 0, err
	}
	return 0, e.store.Complete(write, runID, e.cfg.InstanceID)
}

// modelRequest builds the model's input from the confirmed context only.
func modelRequest(in chat.RunInput) model.Request {
	req := model.Request{ResumeNote: in.ResumeNote, Messages: make([]model.Message, 0, len(in.Messages))}
	for _, m := range in.Messages {
		role := model.RoleUser
		switch m.Role {
		case chat.RoleAssistant:
			role = model.RoleAssistant
		case chat.RoleTool:
			role = model.RoleTool
		}
		req.Messages = append(req.Messages, model.Message{Role: role, Content: m.Content, Fragment: m.Kind == chat.KindFragment})
	}
	return req
}

// userMessage turns a model failure into words for the run's error field.
func userMessage(err error) string {
	var ce *chat.Error
	if errors.As(err, &ce) {
		return ce.Message
	}
	return "the model failed: " + err.Error() + ". Continue from the saved point to try again."
}
