package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// A holder that does not answer (stalled, cut off) while it streams is
// written past by the other instance; the deltas it fans out after that
// lie in the recorded gap and are dropped. Whatever write went past it (a
// fragment saved, a draft deleted), the message that lost deltas is never
// published and no fragment is saved with the hole inside it.

// muteA makes A stop answering yield requests, as a stalled process would.
func (p *sharedPair) muteA() {
	p.net.mu.Lock()
	p.net.mute[p.holderA] = true
	p.net.mu.Unlock()
}

// wantDeltasLost fails unless err says the message lost deltas.
func wantDeltasLost(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, chat.ErrDeltasLost) {
		t.Fatalf("%s: %v, want chat.ErrDeltasLost (the message lost deltas to another instance's write-past)", what, err)
	}
}

// history is the contents of the thread's history, oldest first.
func history(t *testing.T, st *store.Store, threadID string) []string {
	t.Helper()
	snap, err := st.Snapshot(ctx, user, threadID)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range snap.Messages {
		out = append(out, m.Content)
	}
	return out
}

// publishAfterRestart starts the step over on A under a new message, as
// the engine does after chat.ErrDeltasLost, and publishes it whole.
func (p *sharedPair) publishAfterRestart(t *testing.T, words ...string) string {
	t.Helper()
	again, err := p.a.RestartStep(ctx, p.lease, 3)
	if err != nil || !again {
		t.Fatalf("restart the step: %v, %v; want it to run again (attempt 2 of 3)", again, err)
	}
	run, err := p.a.Run(ctx, user, p.runID)
	if err != nil || run.Attempt != 2 {
		t.Fatalf("run after the restart: attempt %d, %v; want 2", run.Attempt, err)
	}
	fresh := chat.NewID(chat.PrefixMessage)
	if err := p.a.AppendDeltas(ctx, p.lease, fresh, words); err != nil {
		t.Fatalf("stream the restarted step: %v", err)
	}
	content := strings.Join(words, "")
	if err := p.a.CompleteWith(ctx, p.lease, chat.StepOutput{Step: pendingStep(t, p.a, p.runID), MessageID: fresh, Kind: chat.KindText, Content: content}); err != nil {
		t.Fatalf("publish the restarted step: %v", err)
	}
	return content
}

// A fragment saved through B while A is stalled: B writes past A's
// reservation. The fragment B's tab saw (all written) is saved whole; the
// delta A fans out after that lies in the gap and is dropped at A's next
// flush, from when on A's appends and its publish of the message are
// refused. A fragment naming the lost delta is refused, saying another
// instance wrote past; a reloaded tab is offered the message only up to
// the hole. The step starts over and publishes a message whole.
func TestSharedWritePastEndsTheHoldersMessage(t *testing.T) {
	p := streamingOnA(t)
	if err := p.a.FlushStream(ctx); err != nil {
		t.Fatal(err)
	}
	p.muteA()
	seen, err := p.b.Snapshot(ctx, user, p.threadID)
	if err != nil || seen.ActiveRun == nil || seen.ActiveRun.MessageID == nil || *seen.ActiveRun.MessageID != p.message {
		t.Fatalf("B's snapshot while A streams: %+v, %v", seen.ActiveRun, err)
	}
	if _, err := p.b.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: p.threadID, MessageID: p.message,
		LastSeq: seen.ActiveRun.LastSeq, ExpectedStateVersion: seen.StateVersion}); err != nil {
		t.Fatalf("save the fragment B's tab saw (seq %d, written) while A is stalled: %v", seen.ActiveRun.LastSeq, err)
	}
	if b := p.b.StreamStats(); b.WrittenPast != 1 {
		t.Fatalf("B %+v: want A's reservation written past", b)
	}
	// A, stalled, does not know yet: its next batch takes the fast path,
	// inside the seqs B recorded lost.
	if err := p.a.AppendDeltas(ctx, p.lease, p.message, []string{" world"}); err != nil {
		t.Fatal(err)
	}
	inGap := p.lastDelta(t)
	if err := p.a.FlushStream(ctx); err != nil {
		t.Fatal(err)
	}
	if a := p.a.StreamStats(); a.DeltasLost != 1 {
		t.Fatalf("A %+v: want the delta fanned out after the write-past dropped as lost", a)
	}
	wantDeltasLost(t, "A's next batch of the message", p.a.AppendDeltas(ctx, p.lease, p.message, []string{"!"}))
	wantDeltasLost(t, "A's publish of the message", p.a.CompleteWith(ctx, p.lease, chat.StepOutput{Step: pendingStep(t, p.a, p.runID),
		MessageID: p.message, Kind: chat.KindText, Content: "Hello there world!"}))

	// A tab that saw the lost delta cannot save it.
	_, err = p.b.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: p.threadID, MessageID: p.message, LastSeq: inGap,
		ExpectedStateVersion: version(t, p.b, p.threadID)})
	var ce *chat.Error
	if !errors.As(err, &ce) || ce.Code != chat.CodeFragmentUnavailable || !strings.Contains(ce.Message, "another instance wrote past") ||
		strings.Contains(ce.Message, "server stopped") {
		t.Fatalf("fragment up to the lost seq %d: %v; want fragment_unavailable naming the write-past", inGap, err)
	}
	// A reloaded tab is offered the message up to the hole, and can save
	// exactly that.
	reload, err := p.a.Snapshot(ctx, user, p.threadID)
	if err != nil {
		t.Fatal(err)
	}
	ar := reload.ActiveRun
	if ar == nil || ar.MessageID == nil || *ar.MessageID != p.message || ar.PartialText != "Hello there" || ar.LastSeq != seen.ActiveRun.LastSeq {
		t.Fatalf("reloaded snapshot's active run %+v; want %s as %q up to seq %d (before the hole)", ar, p.message, "Hello there", seen.ActiveRun.LastSeq)
	}
	if _, err := p.b.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: p.threadID, MessageID: p.message, LastSeq: ar.LastSeq,
		ExpectedStateVersion: reload.StateVersion}); err != nil {
		t.Fatalf("save what the reloaded tab shows: %v", err)
	}

	answer := p.publishAfterRestart(t, "A fresh", " answer")
	got := history(t, p.b, p.threadID)
	want := []string{"hello", "Hello there", "Hello there", answer}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("history %q, want %q", got, want)
	}
	mustCheck(t, p.b, "after the write-past and the restart")
}

// A holder whose publish is its first write after the write-past (the
// flusher had not run): the publish drops the lost deltas and is refused,
// also when none of the message was ever written. A fragment of it says
// nothing was written before another instance wrote past.
func TestSharedWritePastRefusesAPublishWithNothingWritten(t *testing.T) {
	p := streamingOnA(t, func(p *sharedPair) { p.a.PauseFlusher() })
	if n := writtenDeltas(t, p.dsn, p.runID); n != 0 {
		t.Fatalf("%d deltas written with the flusher paused", n)
	}
	p.muteA()
	last := p.lastDelta(t)
	_, err := p.b.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: p.threadID, MessageID: p.message, LastSeq: last,
		ExpectedStateVersion: version(t, p.b, p.threadID)})
	var ce *chat.Error
	if !errors.As(err, &ce) || ce.Code != chat.CodeFragmentUnavailable || !strings.Contains(ce.Message, "another instance wrote past") {
		t.Fatalf("fragment of a message none of which was written: %v; want fragment_unavailable naming the write-past", err)
	}
	wantDeltasLost(t, "A's publish of the message", p.a.CompleteWith(ctx, p.lease, chat.StepOutput{Step: pendingStep(t, p.a, p.runID),
		MessageID: p.message, Kind: chat.KindText, Content: "Hello there"}))
	answer := p.publishAfterRestart(t, "Again")
	if got := history(t, p.b, p.threadID); strings.Join(got, "|") != "hello|"+answer {
		t.Fatalf("history %q, want the request and %q", got, answer)
	}
	mustCheck(t, p.b, "after the write-past and the restart")
}

// A draft deleted through B while A, stalled, streams the next reply: the
// delete writes past A, and A's reply, which lost a delta to that, is
// refused and started over.
func TestSharedDraftDeleteRacingAStalledHolder(t *testing.T) {
	p := streamingOnA(t)
	// The draft: the fragment of A's first reply B's tab saved while A
	// answered (A wrote its deltas and yielded), then A's reply published.
	draft := saveDraft(t, p.b, p.threadID, p.message, p.lastDelta(t))
	if err := p.a.CompleteWith(ctx, p.lease, chat.StepOutput{Step: pendingStep(t, p.a, p.runID), MessageID: p.message, Kind: chat.KindText, Content: "Hello there"}); err != nil {
		t.Fatal(err)
	}
	// The next run, claimed by A, which reserves seqs again and streams.
	p.runID = startRun(t, p.b, p.threadID, version(t, p.b, p.threadID), "more")
	claim, err := p.a.Claim(ctx, p.holderA, time.Hour)
	if err != nil || claim == nil || claim.Run.RunID != p.runID {
		t.Fatalf("claim of the second run on A: %+v, %v", claim, err)
	}
	p.lease, p.message = claim.Lease, chat.NewID(chat.PrefixMessage)
	if err := p.a.AppendDeltas(ctx, p.lease, p.message, []string{"One", " two"}); err != nil {
		t.Fatal(err)
	}
	if err := p.a.FlushStream(ctx); err != nil {
		t.Fatal(err)
	}
	p.muteA()
	if _, err := p.b.DeleteDraft(ctx, chat.DeleteDraft{UserID: user, ThreadID: p.threadID, MessageID: draft.MessageID, ExpectedStateVersion: version(t, p.b, p.threadID)}); err != nil {
		t.Fatalf("delete the draft through B while A is stalled: %v", err)
	}
	if b := p.b.StreamStats(); b.WrittenPast != 1 {
		t.Fatalf("B %+v: want A's reservation written past by the delete", b)
	}
	if err := p.a.AppendDeltas(ctx, p.lease, p.message, []string{" three"}); err != nil {
		t.Fatal(err)
	}
	wantDeltasLost(t, "A's publish of the reply", p.a.CompleteWith(ctx, p.lease, chat.StepOutput{Step: pendingStep(t, p.a, p.runID),
		MessageID: p.message, Kind: chat.KindText, Content: "One two three"}))
	answer := p.publishAfterRestart(t, "Four")
	if got := history(t, p.b, p.threadID); strings.Join(got, "|") != "hello|Hello there|more|"+answer {
		t.Fatalf("history %q, want the draft gone and the restarted reply %q published", got, answer)
	}
	mustCheck(t, p.b, "after the delete, the write-past and the restart")
}
