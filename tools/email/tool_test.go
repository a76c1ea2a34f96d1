package email

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/catalog"
	"regexp"
	"testing"
)

const emailArgs = `{"to":"ann@example.com","subject":"Quote 483","body":"Hello Ann,\nhere is the quote <b>rev 7</b>."}`

func TestSendEmailPrepare(t *testing.T) {
	s := NewSendEmail(openTestOutbox(t, OutboxConfig{}))
	preview, key, err := s.Prepare("thr_1", json.RawMessage(emailArgs))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^email:thr_1:[0-9a-f]{16}:send$`).MatchString(key) {
		t.Fatalf("key %q", key)
	}
	var d EmailDraft
	if err := json.Unmarshal(preview, &d); err != nil {
		t.Fatal(err)
	}
	if d.To != "ann@example.com" || d.Subject != "Quote 483" || d.Body != "Hello Ann,\nhere is the quote <b>rev 7</b>." {
		t.Fatalf("preview %s", preview)
	}
	if want := `{"to":"ann@example.com","subject":"Quote 483","body":"Hello Ann,\nhere is the quote <b>rev 7</b>."}`; string(preview) != want {
		t.Fatalf("preview %s, want %s", preview, want)
	}

	// Same arguments, written differently: same key.
	_, key2, err := s.Prepare("thr_1", json.RawMessage(` {"body":"Hello Ann,\nhere is the quote \u003cb>rev 7</b>.", "subject":"Quote 483","to":"ann@example.com"}`))
	if err != nil {
		t.Fatal(err)
	}
	if key2 != key {
		t.Fatalf("same args, keys %q and %q", key, key2)
	}
	// Different body: different key. Different scope: different key.
	_, key3, _ := s.Prepare("thr_1", json.RawMessage(`{"to":"ann@example.com","subject":"Quote 483","body":"Hello Ann."}`))
	_, key4, _ := s.Prepare("thr_2", json.RawMessage(emailArgs))
	if key3 == key || key4 == key || key3 == "" || key4 == "" {
		t.Fatalf("keys not distinct: %q %q %q", key, key3, key4)
	}

	for _, bad := range []string{
		`{"to":"ann","subject":"s","body":"b"}`,
		`{"to":"ann@example.com","subject":"","body":"b"}`,
		`{"to":"ann@example.com","subject":"s"}`,
		`{"to":"ann@example.com","subject":"s","body":"b","cc":"bob@example.com"}`,
		`[]`,
	} {
		_, _, err := s.Prepare("thr_1", json.RawMessage(bad))
		var ia *tools.InvalidArgs
		if !errors.As(err, &ia) {
			t.Errorf("Prepare(%s): err = %v, want *InvalidArgs", bad, err)
		}
	}
	_, _, err = s.Prepare("thr_1", json.RawMessage(`{"to":"ann","subject":"s","body":"b"}`))
	if want := `invalid tool arguments: field "to" must be an email address`; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
}

func TestSendEmailCommitAndStatus(t *testing.T) {
	ob := openTestOutbox(t, OutboxConfig{})
	s := NewSendEmail(ob)
	ctx := context.Background()
	_, key, err := s.Prepare("thr_1", json.RawMessage(emailArgs))
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Status(ctx, key)
	if err != nil || st.Known || st.Result != nil {
		t.Fatalf("Status before commit = %+v, %v", st, err)
	}
	r1, err := s.Commit(ctx, key, json.RawMessage(emailArgs))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.Commit(ctx, key, json.RawMessage(emailArgs))
	if err != nil {
		t.Fatal(err)
	}
	var res, again EmailResult
	if err := json.Unmarshal(r1, &res); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(r2, &again); err != nil {
		t.Fatal(err)
	}
	if res.Status != "committed" || res.ProviderID == "" || res.Key != key || res.AlreadySent {
		t.Fatalf("result %s", r1)
	}
	// The provider's answer to the key again: the first acceptance, and
	// that nothing was sent this time.
	if again.ProviderID != res.ProviderID || again.Key != key || !again.AlreadySent {
		t.Fatalf("second commit %s, first %s: want the same provider id, marked already sent", r2, r1)
	}
	if acc := accepted(t, ob); len(acc) != 1 || !acc[key] {
		t.Fatalf("accepted = %v", acc)
	}
	st, err = s.Status(ctx, key)
	if err != nil || !st.Known || string(st.Result) != string(r1) {
		t.Fatalf("Status after commit = %+v (%s), %v; want %s", st, st.Result, err, r1)
	}
}

func TestSendEmailCommitFaults(t *testing.T) {
	ctx := context.Background()

	s := NewSendEmail(openTestOutbox(t, OutboxConfig{Fault: FaultReject}))
	_, key, _ := s.Prepare("thr_1", json.RawMessage(emailArgs))
	if _, err := s.Commit(ctx, key, json.RawMessage(emailArgs)); !errors.Is(err, tools.ErrRejected) {
		t.Fatalf("reject: %v", err)
	}
	if st, _ := s.Status(ctx, key); st.Known {
		t.Fatal("rejected key known")
	}

	// The answer is lost: the outcome is unknown until Status finds it.
	s = NewSendEmail(openTestOutbox(t, OutboxConfig{Fault: FaultAcceptThenTimeout}))
	_, err := s.Commit(ctx, key, json.RawMessage(emailArgs))
	if err == nil || errors.Is(err, tools.ErrRejected) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("accept-then-timeout: %v", err)
	}
	st, err := s.Status(ctx, key)
	if err != nil || !st.Known {
		t.Fatalf("Status = %+v, %v", st, err)
	}

	if _, err := s.Commit(ctx, key, json.RawMessage(`{"to":"x"}`)); err == nil {
		t.Fatal("bad args committed")
	}
}

func TestRegistryWithBuiltins(t *testing.T) {
	ob := openTestOutbox(t, OutboxConfig{})
	r, err := tools.NewRegistry(catalog.New(0), NewSendEmail(ob))
	if err != nil {
		t.Fatal(err)
	}
	specs := r.Specs()
	if len(specs) != 2 || specs[0].Name != "catalog_search" || specs[0].Contract != tools.Idempotent ||
		specs[1].Name != "send_email" || specs[1].Contract != tools.Consequential {
		t.Fatalf("specs = %+v", specs)
	}
	for _, s := range specs {
		if !json.Valid(s.Parameters) {
			t.Errorf("%s: parameters not JSON", s.Name)
		}
	}
	if tl, _ := r.Get("catalog_search"); tl == nil {
		t.Fatal("no catalog_search")
	} else if _, ok := tl.(tools.Runner); !ok {
		t.Error("catalog_search is not a tools.Runner")
	}
	if tl, _ := r.Get("send_email"); tl == nil {
		t.Fatal("no send_email")
	} else if _, ok := tl.(tools.Committer); !ok {
		t.Error("send_email is not a tools.Committer")
	}
}
