package chat

import "testing"

func TestRunStateMachine(t *testing.T) {
	all := []RunStatus{RunQueued, RunRunning, RunWaitingConfirmation, RunCancelRequested, RunCancelling, RunCompleted, RunFailed, RunCancelled}
	for _, from := range all {
		if !from.Valid() {
			t.Errorf("%s not valid", from)
		}
		for _, to := range all {
			ok := CanTransition(from, to)
			if from.Terminal() && ok {
				t.Errorf("terminal %s may move to %s", from, to)
			}
			// Once a cancel is accepted the only end is cancelled.
			if from.CancelAccepted() && ok && !to.CancelAccepted() {
				t.Errorf("%s may move to %s", from, to)
			}
		}
	}
	for _, from := range []RunStatus{RunQueued, RunRunning, RunWaitingConfirmation} {
		if !CanTransition(from, RunCancelRequested) {
			t.Errorf("%s cannot be cancelled", from)
		}
	}
	if CanTransition(RunQueued, RunCompleted) || RunStatus("paused").Valid() {
		t.Error("the state machine allows what the protocol does not")
	}
}

func TestNewIDIsPrefixedAndUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		id := NewID(PrefixRun)
		if len(id) != len(PrefixRun)+26 || id[:4] != PrefixRun || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
}

func TestEventEncodeSplicesBody(t *testing.T) {
	ev := Event{Type: EventRunFailed, ThreadID: "thr_1", Seq: 7, TS: 9, StateVersion: 3, RunID: "run_1", Body: RunFailedBody{Error: "boom"}}
	if err := ev.Encode(); err != nil {
		t.Fatal(err)
	}
	want := `{"type":"run.failed","thread_id":"thr_1","seq":7,"ts":9,"state_version":3,"run_id":"run_1","error":"boom"}`
	if string(ev.Raw) != want {
		t.Fatalf("got  %s\nwant %s", ev.Raw, want)
	}
	delta := Event{Type: EventMessageDelta, ThreadID: "thr_1", Seq: 8, TS: 9, RunID: "run_1", Body: MessageDeltaBody{MessageID: "msg_1", Text: "hi"}}
	if err := delta.Encode(); err != nil || delta.Durable() {
		t.Fatal(err)
	}
	if want := `{"type":"message.delta","thread_id":"thr_1","seq":8,"ts":9,"run_id":"run_1","message_id":"msg_1","text":"hi"}`; string(delta.Raw) != want {
		t.Fatalf("delta %s", delta.Raw)
	}
}

func TestTitleFrom(t *testing.T) {
	cases := map[string]string{
		"  How do I plan a trip?\nMore details": "How do I plan a trip?",
		"short":                                 "short",
		"Объясни, пожалуйста, как работают горутины и каналы в Go, с примерами и подробно": "Объясни, пожалуйста, как работают горутины и каналы в Go, с…",
	}
	for in, want := range cases {
		if got := TitleFrom(in); got != want {
			t.Errorf("TitleFrom(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNewIDIncreasesWithinAMillisecond(t *testing.T) {
	prev := NewID(PrefixThread)
	for range 5000 {
		id := NewID(PrefixThread)
		if id <= prev {
			t.Fatalf("%s after %s", id, prev)
		}
		prev = id
	}
}
