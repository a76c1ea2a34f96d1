package engine

import (
	"context"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/model"
)

// Titler names a conversation from its first request: the model backend
// when it can (model/demo summarises the request's words, model/openai asks
// the model). Declared here, where it is used; Config.Titler is optional.
type Titler interface {
	Title(ctx context.Context, request []model.Message) (string, error)
}

// titleTimeout bounds one title request.
const titleTimeout = 20 * time.Second

// nameThread asks the Titler, beside the run's first step, for a title for
// a conversation whose only message is its first request, and gives it to
// the thread if the thread still has the title the store took from that
// request (a title the user chose or changed meanwhile is kept). A title is
// a label: no event, no version. The goroutine is the engine's (its context
// and wait group), not the run's: a cancel of the reply does not lose the
// name of the conversation.
func (e *Engine) nameThread(in chat.RunInput) {
	if e.cfg.Titler == nil || len(in.Messages) != 1 || in.Messages[0].Role != chat.RoleUser || in.Messages[0].Kind != chat.KindText {
		return
	}
	threadID, request := in.Run.ThreadID, in.Messages[0].Content
	auto := chat.TitleFrom(request)
	if auto == "" {
		return
	}
	e.wg.Go(func() {
		ctx, cancel := context.WithTimeout(e.ctx, titleTimeout)
		defer cancel()
		got, err := e.cfg.Titler.Title(ctx, []model.Message{{Role: model.RoleUser, Content: request}})
		if err != nil {
			if e.ctx.Err() == nil {
				e.log.Warn("name the conversation: the model gave no title; it keeps the start of its first request", "thread_id", threadID, "err", err)
			}
			return
		}
		title := chat.TitleFrom(got)
		if title == "" || title == auto {
			return
		}
		if err := e.store.Retitle(context.WithoutCancel(ctx), threadID, auto, title); err != nil && e.ctx.Err() == nil {
			e.log.Warn("name the conversation", "thread_id", threadID, "err", err)
		}
	})
}
