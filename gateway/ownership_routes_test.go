package gateway_test

// The ownership tests' tables of every HTTP route and WebSocket command,
// and the test that they are exactly what the package registers (read from
// its source).

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
)

// ---- what the package registers ----

// Route kinds: how the ownership tests cover a registered pattern.
const (
	routePublic    = "public"    // health: no credentials, no user data
	routeWebSocket = "websocket" // GET /ws: its commands are probed one by one
	routeCreate    = "create"    // makes a thread of the caller; names no id
	routeList      = "list"      // the caller's threads only
	routeIDs       = "ids"       // names ids: probed with another user's
)

// routeCoverage is every pattern gateway.Server.Routes registers. It must
// equal what the source registers (registeredRoutes); a new pattern needs
// an entry here and a case in sampleRequest (and, for routeIDs, probes in
// ownershipProbes).
var routeCoverage = map[string]string{
	"GET /livez":  routePublic,
	"GET /readyz": routePublic,
	"GET /ws":     routeWebSocket,

	"POST /api/threads":                                 routeCreate,
	"GET /api/threads":                                  routeList,
	"GET /api/threads/{id}":                             routeIDs,
	"POST /api/threads/{id}/runs":                       routeIDs,
	"GET /api/runs/{id}":                                routeIDs,
	"POST /api/runs/{id}/cancel":                        routeIDs,
	"POST /api/threads/{id}/fragments":                  routeIDs,
	"GET /api/threads/{id}/streamed/{message_id}":       routeIDs,
	"POST /api/threads/{id}/drafts/{message_id}/delete": routeIDs,
	"POST /api/threads/{id}/fork":                       routeIDs,
	"GET /api/threads/{id}/operations":                  routeIDs,
	"POST /api/operations/{id}/confirm":                 routeIDs,
	"POST /api/operations/{id}/reject":                  routeIDs,
	"GET /api/threads/{id}/checkpoints":                 routeIDs,
	"GET /api/threads/{id}/messages":                    routeIDs,
	"POST /api/threads/{id}/head":                       routeIDs,
	"DELETE /api/threads/{id}":                          routeIDs,
	"GET /api/threads/{id}/events":                      routeIDs,
	"POST /api/threads/{id}/queue":                      routeIDs,
	"POST /api/threads/{id}/queue/resume":               routeIDs,
	"PATCH /api/threads/{id}/queue/{item_id}":           routeIDs,
	"DELETE /api/threads/{id}/queue/{item_id}":          routeIDs,
	"/api/": routeIDs, // unknown endpoints: not_found, ids in the path or not

	// The OpenAI Responses API: a response id is its run's behind "resp_".
	"GET /v1/models":                 routeList, // the model served: no user data
	"GET /v1/models/{model}":         routeList,
	"POST /v1/responses":             routeIDs, // previous_response_id names one
	"GET /v1/responses/{id}":         routeIDs,
	"POST /v1/responses/{id}/cancel": routeIDs,
	"/v1/":                           routeIDs, // unknown endpoints: not_found
}

// wsCoverage is every command the WebSocket dispatch understands. It must
// equal registeredCommands; every command but hello needs probes.
var wsCoverage = map[string]string{
	"hello":           "names no id",
	"subscribe":       "thread",
	"unsubscribe":     "thread (acknowledged whatever the id: it only stops this connection's own feed)",
	"run.start":       "thread, checkpoint",
	"run.cancel":      "run",
	"fragment.save":   "thread, streamed message",
	"draft.delete":    "thread, message",
	"thread.fork":     "thread, checkpoint",
	"thread.checkout": "thread, checkpoint",
	"thread.delete":   "thread",
	"tool.confirm":    "operation",
	"tool.reject":     "operation",
	"queue.add":       "thread",
	"queue.update":    "thread, queue item",
	"queue.remove":    "thread, queue item",
	"queue.resume":    "thread",
}

// packageFiles parses the gateway package's non-test sources.
func packageFiles(t *testing.T) (*token.FileSet, []*ast.File) {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		t.Fatal("no gateway sources found: run the test from the package folder")
	}
	return fset, files
}

// registeredRoutes lists the pattern of every X.Handle / X.HandleFunc call
// in the package. A pattern that is not a string literal cannot be checked
// and fails the test.
func registeredRoutes(t *testing.T) []string {
	t.Helper()
	fset, files := packageFiles(t)
	var out []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: a route with a computed pattern: the ownership tests cannot see it; register it with a literal", fset.Position(call.Pos()))
				return true
			}
			p, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, p)
			return true
		})
	}
	slices.Sort(out)
	return out
}

// registeredCommands lists the string cases of the switch on typ in
// (*wsConn).dispatch: every WebSocket command type.
func registeredCommands(t *testing.T) []string {
	t.Helper()
	_, files := packageFiles(t)
	var out []string
	found := false
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "dispatch" || fn.Recv == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sw, ok := n.(*ast.SwitchStmt)
				if !ok {
					return true
				}
				if id, ok := sw.Tag.(*ast.Ident); !ok || id.Name != "typ" {
					return true
				}
				found = true
				for _, s := range sw.Body.List {
					for _, e := range s.(*ast.CaseClause).List {
						lit, ok := e.(*ast.BasicLit)
						if !ok || lit.Kind != token.STRING {
							t.Errorf("a WebSocket command case that is not a string literal: the ownership tests cannot see it")
							continue
						}
						v, _ := strconv.Unquote(lit.Value)
						out = append(out, v)
					}
				}
				return false
			})
		}
	}
	if !found {
		t.Fatal("no switch on typ in a dispatch method: update registeredCommands to find the WebSocket commands")
	}
	slices.Sort(out)
	return out
}

// ---- tests ----

// TestOwnershipCoversEveryRouteAndCommand: the route and command tables
// here are exactly what the package registers (read from its source and
// confirmed on a live mux), every probe reaches the route it names, and
// every route and command that takes ids has probes.
func TestOwnershipCoversEveryRouteAndCommand(t *testing.T) {
	t.Parallel()
	routes := registeredRoutes(t)
	if want := slices.Sorted(maps.Keys(routeCoverage)); !slices.Equal(routes, want) {
		t.Errorf("registered routes %q\nownership table  %q\nadd every new route to routeCoverage, sampleRequest and ownershipProbes", routes, want)
	}
	cmds := registeredCommands(t)
	if want := slices.Sorted(maps.Keys(wsCoverage)); !slices.Equal(cmds, want) {
		t.Errorf("WebSocket commands %q\nownership table   %q\nadd every new command to wsCoverage and ownershipProbes", cmds, want)
	}

	mux := http.NewServeMux()
	gateway.New(gateway.Config{}).Routes(mux)
	// Each pattern found in the source is really registered: registering it
	// again conflicts.
	for _, p := range routes {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("pattern %q from the source is not registered by Routes", p)
				}
			}()
			mux.Handle(p, http.NotFoundHandler())
		}()
	}

	w := fakeWorld()
	for _, p := range routes {
		if r, ok := sampleRequest(t, p, w); ok {
			if got := routedTo(mux, r); got != p {
				t.Errorf("sample request %s %s reaches %q, want %q", r.method, r.path, got, p)
			}
		}
	}
	byRoute, byCommand := map[string]int{}, map[string]int{}
	for _, p := range ownershipProbes(w, chat.NewID(chat.PrefixThread), 1) {
		r := p.build(p.foreign)
		if r.route != "" {
			byRoute[r.route]++
			if got := routedTo(mux, r); got != r.route {
				t.Errorf("probe %q: %s %s reaches %q, want %q", p.name, r.method, r.path, got, r.route)
			}
		}
		if r.ws != nil {
			typ, _ := r.ws["type"].(string)
			if !slices.Contains(cmds, typ) {
				t.Errorf("probe %q sends unknown command %q", p.name, typ)
			}
			byCommand[typ]++
		}
	}
	for _, p := range routes {
		if routeCoverage[p] == routeIDs && byRoute[p] == 0 {
			t.Errorf("route %q takes ids but has no ownership probe", p)
		}
	}
	for _, c := range cmds {
		if c != "hello" && byCommand[c] == 0 {
			t.Errorf("command %q has no ownership probe", c)
		}
	}
}
