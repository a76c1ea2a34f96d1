package chat

import (
	"errors"
	"strings"
	"testing"
)

func TestCommandsHoldTheProtocolLimits(t *testing.T) {
	s := func(v string) *string { return &v }
	long := strings.Repeat("x", MaxUserMessageBytes+1)
	for _, tc := range []struct {
		name string
		err  error
		want string // "" : valid
	}{
		{"a message at the limit", StartRun{ThreadID: "thr_1", UserMessage: s(long[1:])}.Validate(), ""},
		{"no message (continue)", StartRun{ThreadID: "thr_1"}.Validate(), ""},
		{"a message over the limit", StartRun{UserMessage: s(long)}.Validate(), "user_message is 32769 bytes; the maximum is 32768"},
		{"an empty message", StartRun{UserMessage: s("")}.Validate(), "user_message must not be empty"},
		{"a message that is not UTF-8", StartRun{UserMessage: s("caf\xe9")}.Validate(), "user_message is not valid UTF-8"},
		{"a negative version", StartRun{ExpectedStateVersion: -1}.Validate(), "expected_state_version must not be negative: send the state_version of the last event you applied"},
		{"an over-long checkpoint id", StartRun{ResumeFromCheckpointID: strings.Repeat("c", MaxIDBytes+1)}.Validate(), "resume_from_checkpoint_id is 65 bytes; ids are at most 64 bytes"},
		{"an over-long request id", StartRun{ClientRequestID: strings.Repeat("r", MaxClientRequestIDBytes+1)}.Validate(), "client_request_id is 129 bytes; the maximum is 128"},
		{"a cancel with its reason", CancelRun{RunID: "run_1", Reason: ReasonUserRequested}.Validate(), ""},
		{"a cancel without a reason", CancelRun{RunID: "run_1"}.Validate(), "reason must not be empty"},
		{"a cancel without a run", CancelRun{Reason: "x"}.Validate(), "run_id is required"},
		{"a cancel with an over-long reason", CancelRun{RunID: "run_1", Reason: strings.Repeat("r", MaxReasonBytes+1)}.Validate(), "reason is 201 bytes; the maximum is 200"},
		{"a fragment", SaveFragment{MessageID: "msg_1", LastSeq: 1}.Validate(), ""},
		{"a fragment without a message", SaveFragment{LastSeq: 1}.Validate(), "message_id is required"},
		{"a fragment before any delta", SaveFragment{MessageID: "msg_1"}.Validate(), "last_seq must be at least 1: the seq of the last delta you displayed"},
		{"a fragment at a negative version", SaveFragment{MessageID: "msg_1", LastSeq: 3, ExpectedStateVersion: -2}.Validate(), "expected_state_version must not be negative: send the state_version of the last event you applied"},
		{"a draft deletion", DeleteDraft{ThreadID: "thr_1", MessageID: "msg_1"}.Validate(), ""},
		{"a draft deletion with an over-long message id", DeleteDraft{ThreadID: "thr_1", MessageID: strings.Repeat("m", MaxIDBytes+1)}.Validate(), "message_id is 65 bytes; ids are at most 64 bytes"},
		{"a draft deletion at a negative version", DeleteDraft{ThreadID: "thr_1", MessageID: "msg_1", ExpectedStateVersion: -1}.Validate(), "expected_state_version must not be negative: send the state_version of the last event you applied"},
		{"a fork", Fork{ThreadID: "thr_1", FromCheckpointID: "cp_1"}.Validate(), ""},
		{"a fork from nowhere", Fork{ThreadID: "thr_1"}.Validate(), "from_checkpoint_id is required"},
		{"a checkout", Checkout{ThreadID: "thr_1", CheckpointID: "cp_1", ExpectedStateVersion: 4}.Validate(), ""},
		{"a checkout with an over-long checkpoint", Checkout{ThreadID: "thr_1", CheckpointID: strings.Repeat("c", MaxIDBytes+1)}.Validate(), "checkpoint_id is 65 bytes; ids are at most 64 bytes"},
		{"a deletion without a version", DeleteThread{ThreadID: "thr_1"}.Validate(), ""},
		{"a deletion at a negative version", DeleteThread{ThreadID: "thr_1", ExpectedStateVersion: new(int64(-1))}.Validate(), "expected_state_version must not be negative: send the state_version of the last event you applied"},
		{"a decision", Decide{OperationID: "op_1", Confirm: true}.Validate(), ""},
		{"a decision without an operation", Decide{}.Validate(), "operation_id is required"},
	} {
		var ce *Error
		switch {
		case tc.want == "" && tc.err != nil:
			t.Errorf("%s: %v, want valid", tc.name, tc.err)
		case tc.want != "" && (!errors.As(tc.err, &ce) || ce.Code != CodeInvalidRequest || ce.Message != tc.want):
			t.Errorf("%s: %v, want invalid_request %q", tc.name, tc.err, tc.want)
		}
	}
}
