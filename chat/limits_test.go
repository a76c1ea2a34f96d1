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
		{"a negative version", StartRun{ExpectedStateVersion: -1}.Validate(), "expected_state_version must not be negative"},
		{"an over-long checkpoint id", StartRun{ResumeFromCheckpointID: strings.Repeat("c", MaxIDBytes+1)}.Validate(), "resume_from_checkpoint_id is 65 bytes; ids are at most 64 bytes"},
		{"an over-long request id", StartRun{ClientRequestID: strings.Repeat("r", MaxClientRequestIDBytes+1)}.Validate(), "client_request_id is 129 bytes; the maximum is 128"},
		{"a cancel with its reason", CancelRun{RunID: "run_1", Reason: ReasonUserRequested}.Validate(), ""},
		{"a cancel without a reason", CancelRun{RunID: "run_1"}.Validate(), "reason must not be empty"},
		{"a cancel without a run", CancelRun{Reason: "x"}.Validate(), "run_id is required"},
		{"a cancel with an over-long reason", CancelRun{RunID: "run_1", Reason: strings.Repeat("r", MaxReasonBytes+1)}.Validate(), "reason is 201 bytes; the maximum is 200"},
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
