package bus_test

import (
	"errors"
	"testing"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
)

func events(thread string, from, to int64) []*chat.Event {
	var out []*chat.Event
	for s := from; s <= to; s++ {
		out = append(out, &chat.Event{ThreadID: thread, Seq: s})
	}
	return out
}

func TestSubscriptionGetsItsThreadInOrder(t *testing.T) {
	b := bus.NewMemory()
	a := b.Subscribe("thr_a", 10)
	defer a.Close()
	other := b.Subscribe("thr_b", 10)
	defer other.Close()
	b.Publish(append(events("thr_a", 1, 3), events("thr_b", 1, 1)...))
	for want := int64(1); want <= 3; want++ {
		if ev := <-a.Events(); ev.Seq != want || ev.ThreadID != "thr_a" {
			t.Fatalf("got %+v, want seq %d of thr_a", ev, want)
		}
	}
	if ev := <-other.Events(); ev.ThreadID != "thr_b" {
		t.Fatalf("thr_b got %+v", ev)
	}
	select {
	case ev := <-a.Events():
		t.Fatalf("thr_a got an extra event %+v", ev)
	default:
	}
}

// A subscriber that falls behind is dropped at the first event it cannot
// take and never receives a later one: it sees a prefix, then ErrLagged.
func TestLaggingSubscriberIsDroppedWithoutGap(t *testing.T) {
	b := bus.NewMemory()
	slow := b.Subscribe("thr_a", 2)
	fast := b.Subscribe("thr_a", 100)
	defer fast.Close()
	b.Publish(events("thr_a", 1, 5))
	var got []int64
	for ev := range slow.Events() {
		got = append(got, ev.Seq)
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 2 || !errors.Is(slow.Err(), bus.ErrLagged) {
		t.Fatalf("slow got %v, err %v; want [1 2] and ErrLagged", got, slow.Err())
	}
	b.Publish(events("thr_a", 6, 6))
	for want := int64(1); want <= 6; want++ {
		if ev := <-fast.Events(); ev.Seq != want {
			t.Fatalf("fast subscriber got seq %d, want %d", ev.Seq, want)
		}
	}
	slow.Close() // safe after the bus ended it
}

func TestCloseEndsWithoutError(t *testing.T) {
	b := bus.NewMemory()
	s := b.Subscribe("thr_a", 1)
	s.Close()
	s.Close()
	if _, ok := <-s.Events(); ok || s.Err() != nil {
		t.Fatalf("closed subscription: open=%v err=%v", ok, s.Err())
	}
	b.Publish(events("thr_a", 1, 1)) // no panic on a closed channel
}
