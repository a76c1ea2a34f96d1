package web

import (
	"fmt"

	"github.com/honestcancel/gateway/chat"
)

// A run that waits for a free slot (docs/protocol.md "Admission"): the first
// paint says where it stands in the same words as the page script
// (static/src/admission.ts), so a reload shows it at once.

// waitingHint says what waiting means, under the label.
const waitingHint = "The server is busy with other replies. Yours starts by itself when a slot frees up; nothing has been generated yet. Cancel withdraws it."

// waitingPosition is the queue position of the snapshot's active run while
// it waits for a slot (1 = next to start), 0 when it does not wait.
func waitingPosition(snap chat.Snapshot) int {
	ar := snap.ActiveRun
	if ar == nil || ar.Status != chat.RunQueued || ar.QueuePosition < 1 {
		return 0
	}
	return ar.QueuePosition
}

// waitingLabel says where a waiting run stands: position 1 is next to
// start, 3 has two runs ahead of it.
func waitingLabel(position int) string {
	if position <= 1 {
		return "Waiting for a free slot (next to start)"
	}
	return fmt.Sprintf("Waiting for a free slot (%d ahead)", position-1)
}
