package chat

// RunStatus is a run's place in the state machine of the protocol.
type RunStatus string

const (
	RunQueued              RunStatus = "queued"
	RunRunning             RunStatus = "running"
	RunWaitingConfirmation RunStatus = "waiting_confirmation"
	RunCancelRequested     RunStatus = "cancel_requested"
	RunCancelling          RunStatus = "cancelling"
	RunCompleted           RunStatus = "completed"
	RunFailed              RunStatus = "failed"
	RunCancelled           RunStatus = "cancelled"
)

// Terminal reports whether no further transition is allowed.
func (s RunStatus) Terminal() bool {
	return s == RunCompleted || s == RunFailed || s == RunCancelled
}

// CancelAccepted reports whether a cancel was recorded: from then on the run
// can only end cancelled.
func (s RunStatus) CancelAccepted() bool {
	return s == RunCancelRequested || s == RunCancelling || s == RunCancelled
}

// Valid reports whether s is one of the protocol's statuses.
func (s RunStatus) Valid() bool {
	_, ok := transitions[s]
	return ok
}

// transitions lists the legal moves of the run state machine. Recovery of an
// interrupted attempt re-queues a running run (running -> queued) with its
// attempt counter bumped; a shutdown hands a run back the same way.
var transitions = map[RunStatus][]RunStatus{
	RunQueued:              {RunRunning, RunCancelRequested, RunFailed},
	RunRunning:             {RunCompleted, RunFailed, RunWaitingConfirmation, RunCancelRequested, RunQueued},
	RunWaitingConfirmation: {RunRunning, RunCancelRequested},
	RunCancelRequested:     {RunCancelling, RunCancelled},
	RunCancelling:          {RunCancelled},
	RunCompleted:           nil,
	RunFailed:              nil,
	RunCancelled:           nil,
}

// CanTransition reports whether from -> to is a legal move.
func CanTransition(from, to RunStatus) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// ResumePolicyRegenerate is the only resume policy: the pending step runs
// again with the confirmed context; discarded text is never glued on.
const ResumePolicyRegenerate = "regenerate_pending_step"

// Cancel reasons and error texts the engine writes.
const (
	ReasonUserRequested = "user_requested"
	// ReasonThreadDeleted: the run's conversation was deleted (thread.delete
	// cancels a run in flight first).
	ReasonThreadDeleted = "thread_deleted"
	ErrorInterrupted    = "interrupted"
)
