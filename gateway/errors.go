package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/honestcancel/gateway/chat"
)

// maxBody bounds a request body (the largest valid one, a run.start with a
// 32768-byte user_message, is at most about 200 KiB even fully escaped);
// over it the answer is invalid_request, read no further.
const maxBody = 1 << 20

// ErrorBody renders err in the protocol's error shape (without "re"). Any
// error that is not a *chat.Error is internal: its details go to the log
// only.
func ErrorBody(err error, log *slog.Logger) (int, map[string]any) {
	var ce *chat.Error
	if !errors.As(err, &ce) {
		log.Error("internal error", "err", err)
		ce = chat.Errorf(chat.CodeInternal, "something went wrong on the server; try again, and report it if it persists")
	}
	body := map[string]any{"type": "error", "error": ce.Code, "message": ce.Message}
	for k, v := range ce.Fields {
		body[k] = v
	}
	return chat.HTTPStatus(ce.Code), body
}

// errorWriter writes an error answer in one of the gateway's two shapes:
// the protocol's (writeError) or the OpenAI API's (writeOpenAIError).
type errorWriter func(w http.ResponseWriter, log *slog.Logger, err error)

// The OpenAI shape's own fields an error may carry (chat.Error.Fields):
// param names the request parameter at fault; openAICode replaces the
// protocol code in "code" where OpenAI's clients know a code of their own
// for the same refusal (model_not_found).
const (
	fieldParam = "param"
	openAICode = "openai_code"
)

// OpenAIErrorBody renders err in the OpenAI API's error shape,
// {"error": {message, type, param, code}}, derived from ErrorBody: the
// same status and message, code is the protocol's code (or the one the
// error names for OpenAI's clients, see openAICode), type is OpenAI's
// class of the status, param the parameter at fault (null when none), and
// the protocol error's extra fields (current_state_version, …) sit beside
// them.
func OpenAIErrorBody(err error, log *slog.Logger) (int, map[string]any) {
	status, body := ErrorBody(err, log)
	inner := map[string]any{"message": body["message"], "type": openAIErrorType(status), "param": nil, "code": body["error"]}
	for k, v := range body {
		switch k {
		case "type", "error", "message":
		case fieldParam:
			inner["param"] = v
		case openAICode:
			inner["code"] = v
		default:
			inner[k] = v
		}
	}
	return status, map[string]any{"error": inner}
}

// openAIErrorType is the OpenAI API's error type of an HTTP status.
func openAIErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// writeOpenAIError writes err in the OpenAI API's error shape. Only a
// rate_limited answer may be retried as it is (with Retry-After): every
// other says X-Should-Retry: false, which the OpenAI SDKs obey, so that
// they do not resend a create (there is no idempotency key to make that
// safe) or a refused request that cannot succeed unchanged.
func writeOpenAIError(w http.ResponseWriter, log *slog.Logger, err error) {
	status, body := OpenAIErrorBody(err, log)
	if secs, ok := chat.RetryAfter(err); ok {
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	if status != http.StatusTooManyRequests {
		w.Header().Set("X-Should-Retry", "false")
	}
	writeJSON(w, status, body)
}

// Whether a command's body may be empty (decode's allowEmpty).
const (
	mustHaveBody = false
	mayBeEmpty   = true
)

// serveCommand serves one command over HTTP: the body decoded into a Req,
// the id of the object it acts on read from the path's {id} (checked as
// field), the domain command built by build (presence of the fields, then
// the command's Validate), performed by do, and its answer written with
// status, or the first error in the protocol's shape. Nothing is performed
// unless every check passed.
func serveCommand[Req, Cmd, Ack any](s *Server, w http.ResponseWriter, r *http.Request, status int, emptyOK bool, field string,
	build func(req Req, userID, id string) (Cmd, error), do func(ctx context.Context, c Cmd) (Ack, error)) {
	var req Req
	if err := decode(w, r, &req, emptyOK); err != nil {
		writeError(w, s.log, err)
		return
	}
	id, err := pathID(r, "id", field)
	var c Cmd
	if err == nil {
		c, err = build(req, userID(r), id)
	}
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	ack, err := do(r.Context(), c)
	s.reply(w, status, ack, err)
}

// inCallersName adapts the decoder of a command that records who asked for
// it (requested_by) to serveCommand's build, naming the HTTP caller
// api:<client> (clientName).
func inCallersName[Req, Cmd any](r *http.Request, command func(req Req, userID, id, requestedBy string) (Cmd, error)) func(req Req, userID, id string) (Cmd, error) {
	return func(req Req, userID, id string) (Cmd, error) {
		return command(req, userID, id, "api:"+clientName(r))
	}
}

// serveLookup serves a read of one object over HTTP: its id read from the
// path's {id} (checked as field), what lookup finds under it for the
// caller written with 200, or the first error in the protocol's shape.
func serveLookup[T any](s *Server, w http.ResponseWriter, r *http.Request, field string, lookup func(ctx context.Context, userID, id string) (T, error)) {
	id, err := pathID(r, "id", field)
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	answer, err := lookup(r.Context(), userID(r), id)
	s.reply(w, http.StatusOK, answer, err)
}

// reply writes a command's answer with status, or err in the protocol's
// error shape.
func (s *Server) reply(w http.ResponseWriter, status int, answer any, err error) {
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	writeJSON(w, status, answer)
}

// writeError writes err in the protocol's error shape; a rate_limited
// error that knows when to retry (retry_after_seconds) also sets
// Retry-After.
func writeError(w http.ResponseWriter, log *slog.Logger, err error) {
	status, body := ErrorBody(err, log)
	if secs, ok := chat.RetryAfter(err); ok {
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	securityHeaders(w.Header())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// securityHeaders are set on every API answer: no sniffing a JSON body into
// something else, never framed, no referrer leaks.
func securityHeaders(h http.Header) {
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	h.Set("Referrer-Policy", "no-referrer")
}

// decode reads one JSON object into dst: unknown fields, a key given
// twice, wrong types, trailing data and oversized bodies are
// invalid_request with a message naming the problem. An empty body decodes as {} when allowEmpty.
func decode(w http.ResponseWriter, r *http.Request, dst any, allowEmpty bool) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		if allowEmpty {
			return nil
		}
		return chat.Invalid("request body is empty: send a JSON object")
	}
	return decodeJSON(body, dst)
}

// readBody reads a request body, at most maxBody bytes: over it, or when
// it cannot be read, the answer is invalid_request saying so.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, chat.Invalid("request body is over %d bytes", maxBody)
		}
		return nil, chat.Invalid("could not read the request body: %v", err)
	}
	return body, nil
}

func decodeJSON(body []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonError(err)
	}
	// Anything after the object but white space is refused (dec.More alone
	// lets a stray "}" or "]" through).
	if _, err := dec.Token(); err != io.EOF {
		return chat.Invalid("request body holds more than one JSON value: send exactly one object")
	}
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return chat.Invalid("request must be a JSON object")
	}
	if err := duplicateKey(body); err != nil {
		return err
	}
	return exactFields(body, dst)
}

// exactFields refuses keys that encoding/json would match to a field only
// case-insensitively ("Expected_State_Version"): the protocol's field names
// are exact.
func exactFields(body []byte, dst any) error {
	t := reflect.TypeOf(dst)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return jsonError(err)
	}
	known := map[string]bool{}
	jsonNames(t, known)
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !known[k] {
			return chat.Invalid("unknown field %s: field names are case-sensitive; check them in the API documentation", quoteShort(k))
		}
	}
	return nil
}

// jsonNames collects the JSON names of a struct's fields, including those
// promoted from embedded structs.
func jsonNames(t reflect.Type, into map[string]bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("json") == "" {
			jsonNames(f.Type, into)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		into[name] = true
	}
}

func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return chat.Invalid("malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return chat.Invalid("request must be a JSON object, not %s", typ.Value)
		}
		return chat.Invalid("field %q must be %s, not %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return chat.Invalid("malformed JSON: the body ends early")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		if unq, err := strconv.Unquote(name); err == nil {
			name = unq
		}
		return chat.Invalid("unknown field %s: check the field names in the API documentation", quoteShort(name))
	}
	return chat.Invalid("malformed JSON: %v", err)
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "int64", "int", "int32", "uint64", "float64":
		return "a number"
	case "bool":
		return "true or false"
	case "ptr", "pointer":
		return "of the documented type"
	}
	return fmt.Sprintf("a %s", k)
}
