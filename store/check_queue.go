package store

import "github.com/honestcancel/gateway/chat"

// checkQueue: invariant 11. In the rows: a run that names a queue item
// names one of its thread that says it started exactly that run; an item
// that started names a run that names it; a removed item started nothing.
// In the event log, replayed from its start (or from the first
// queue.updated it still holds): every run.started of an after item
// follows a queue.updated that was not paused (none held before it: the
// queue as a new thread has it, not paused, unless the log was purged),
// and no queue.updated after a run's start shows its item still waiting.
func checkQueue(a *auditor, th *auditThread) {
	items := make(map[string]queueItemRow, len(th.items))
	for _, it := range th.items {
		items[it.ItemID] = it
	}
	startedBy := map[string][]string{} // item -> runs naming it
	for _, r := range th.runs {
		if !r.QueueItemID.Valid {
			continue
		}
		id := r.QueueItemID.String
		startedBy[id] = append(startedBy[id], r.RunID)
		it, ok := items[id]
		switch {
		case !ok:
			a.add(11, "run %s names queue item %s, which its thread %s does not have", r.RunID, id, th.row.ThreadID)
		case it.State == itemRemoved:
			a.add(11, "run %s started from queue item %s, which was removed", r.RunID, id)
		case it.State != itemStarted || it.RunID.String != r.RunID:
			a.add(11, "run %s started from queue item %s, which is %s with run %q", r.RunID, id, it.State,
				it.RunID.String)
		}
	}
	for _, it := range th.items {
		runs := startedBy[it.ItemID]
		switch {
		case len(runs) > 1:
			a.add(11, "queue item %s started %d runs: %v", it.ItemID, len(runs), runs)
		case it.State == itemStarted && len(runs) == 0:
			a.add(11, "queue item %s says it started run %s, which does not name it", it.ItemID, it.RunID.String)
		case it.State != itemStarted && it.RunID.Valid:
			a.add(11, "queue item %s is %s yet names run %s", it.ItemID, it.State, it.RunID.String)
		}
	}

	if len(th.items) == 0 {
		return // no queue was ever used: the log holds nothing of it to check
	}

	// The log. known: whether the queue's state before the event is known
	// (the log is held from its start, or a queue.updated was seen).
	known := th.row.EventsPurgedThrough == 0
	paused := false
	started := map[string]int64{} // item -> the seq of its run.started
	for _, e := range th.events {
		if e.bodyErr != nil {
			continue // invariant 8 reports undecodable payloads
		}
		switch e.Type {
		case chat.EventQueueUpdated:
			if e.body.Queue == nil {
				a.add(11, "queue.updated seq %d of thread %s has no queue", e.Seq, th.row.ThreadID)
				continue
			}
			known, paused = true, e.body.Queue.Paused
			for _, w := range e.body.Queue.Items {
				if seq, ok := started[w.ItemID]; ok {
					a.add(11, "queue.updated seq %d shows item %s waiting after its run started (seq %d)", e.Seq,
						w.ItemID, seq)
				}
			}
		case chat.EventRunStarted:
			id := e.body.QueueItemID
			if id == "" {
				continue
			}
			if seq, ok := started[id]; ok {
				a.add(11, "queue item %s started twice in the log (seqs %d and %d)", id, seq, e.Seq)
			}
			started[id] = e.Seq
			if it, ok := items[id]; ok && known && paused && it.Mode != chat.QueueInterrupt {
				a.add(11, "run %s started from queue item %s (seq %d) while the queue was paused", e.RunID.String,
					id, e.Seq)
			}
		}
	}
}
