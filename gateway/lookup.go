package gateway

import (
	"context"
	"net/http"
	"strings"

	"github.com/honestcancel/gateway/chat"
)

// maxLookupIDs is how many messages one lookup may name.
const maxLookupIDs = 20

// lookupMessages answers messages of a thread by id, on any of its
// branches (GET /api/threads/{id}/messages?ids=a,b): {thread_id,
// messages}, in the order asked, those not of this thread (or deleted)
// left out, at most chat.HistoryPageBytes of content but for the first.
func (s *Server) lookupMessages(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Has("before") || q.Has("limit") {
		writeError(w, s.log, chat.Invalid("ids names messages to look up: it goes without before and limit, which page the history"))
		return
	}
	ids := strings.Split(q.Get("ids"), ",")
	if len(ids) > maxLookupIDs {
		writeError(w, s.log, chat.Invalid("ids names at most %d messages (it named %d): ask for the rest in another request", maxLookupIDs, len(ids)))
		return
	}
	for _, id := range ids {
		if err := chat.CheckID("each of ids", id); err != nil {
			writeError(w, s.log, err)
			return
		}
	}
	serveLookup(s, w, r, "thread_id", func(ctx context.Context, userID, threadID string) (map[string]any, error) {
		msgs, err := s.store.MessagesByID(ctx, userID, threadID, ids, chat.HistoryPageBytes)
		return map[string]any{"thread_id": threadID, "messages": msgs}, err
	})
}
