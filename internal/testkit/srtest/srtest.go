// Package srtest is an in-test Confluent schema registry: an httptest
// server with the endpoints tidemark's registry client uses
// (/schemas/ids/{id} and /subjects/{subject}/versions/{version}), whose
// answers a test can turn into an outage, or replace for one schema id as
// a misbehaving proxy would, and producers' encoders built on
// franz-go's own serde, so that records carry the bytes real producers
// send.
package srtest

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// Registry is an in-test schema registry.
type Registry struct {
	srv *httptest.Server

	mu       sync.Mutex
	byID     map[int]sr.SubjectSchema
	subjects map[string][]int // the ids of each subject's versions, version 1 first
	nextID   int
	fail     func(w http.ResponseWriter, r *http.Request) bool
	answers  map[string]answer // replaced answers by path, until Heal
	heal     func()            // releases the requests Hang holds
	auth     func(r *http.Request) bool

	requests atomic.Int64
	failed   atomic.Int64
}

// New starts a registry, closed when the test ends.
func New(tb testing.TB) *Registry {
	tb.Helper()
	return NewWith(tb, Options{})
}

// Options are how a registry of NewWith is reached.
type Options struct {
	// TLS, when set, makes the registry an https server with this
	// configuration (its certificate, and whether it asks for clients').
	TLS *tls.Config
	// Auth, when set, decides whether a request is authenticated; the
	// others are answered 401 with Confluent's error code 40101.
	Auth func(r *http.Request) bool
}

// NewWith starts a registry reached as opts says, closed when the test
// ends.
func NewWith(tb testing.TB, opts Options) *Registry {
	tb.Helper()
	g := &Registry{byID: map[int]sr.SubjectSchema{}, subjects: map[string][]int{}, nextID: 1, auth: opts.Auth}
	g.srv = httptest.NewUnstartedServer(http.HandlerFunc(g.serve))
	if opts.TLS != nil {
		// Refused handshakes are what TLS tests try; do not log them.
		g.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		g.srv.TLS = opts.TLS
		g.srv.StartTLS()
	} else {
		g.srv.Start()
	}
	tb.Cleanup(g.srv.Close)
	return g
}

// URL is the registry's base URL.
func (g *Registry) URL() string { return g.srv.URL }

// Requests counts the requests served, failed ones included; Failed
// counts those that an outage failed or Answer answered.
func (g *Registry) Requests() int64 { return g.requests.Load() }

// Failed counts the requests that an outage failed.
func (g *Registry) Failed() int64 { return g.failed.Load() }

// Register adds s as the next version of subject under a new id, and
// returns the id.
func (g *Registry) Register(subject string, s sr.Schema) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	id := g.nextID
	g.nextID++
	g.subjects[subject] = append(g.subjects[subject], id)
	g.byID[id] = sr.SubjectSchema{Subject: subject, Version: len(g.subjects[subject]), ID: id, Schema: s}
	return id
}

// RegisterAs is Register with the id given; later ids of Register come
// after it.
func (g *Registry) RegisterAs(subject string, id int, s sr.Schema) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.nextID = max(g.nextID, id+1)
	g.subjects[subject] = append(g.subjects[subject], id)
	g.byID[id] = sr.SubjectSchema{Subject: subject, Version: len(g.subjects[subject]), ID: id, Schema: s}
}

// Fail makes every request answer with status and body until Heal; a
// body of "" answers without one.
func (g *Registry) Fail(status int, body string) {
	g.setFail(func(w http.ResponseWriter, _ *http.Request) bool {
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
		return true
	})
}

// Hang makes every request wait, unanswered, until the client gives up or
// Heal.
func (g *Registry) Hang() {
	healed := make(chan struct{})
	var once sync.Once
	g.setFail(func(_ http.ResponseWriter, r *http.Request) bool {
		select {
		case <-r.Context().Done():
		case <-healed:
		}
		return true
	})
	g.mu.Lock()
	g.heal = func() { once.Do(func() { close(healed) }) }
	g.mu.Unlock()
}

// answer is what Answer makes the registry say for a schema id.
type answer struct {
	status int
	body   string
}

// Answer makes the requests for schema id (GET /schemas/ids/{id}) answer
// with status and body, whatever the registry holds, until Heal; the
// other requests are answered as before. It stands for a proxy, or a
// registry, that answers one id wrongly: Answer(60, 200, "{}").
func (g *Registry) Answer(id, status int, body string) {
	g.AnswerPath("/schemas/ids/"+strconv.Itoa(id), status, body)
}

// AnswerPath is Answer for the GET requests of path, as sent (escaped):
// "/subjects/item/versions/1", say.
func (g *Registry) AnswerPath(path string, status int, body string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.answers == nil {
		g.answers = map[string]answer{}
	}
	g.answers[path] = answer{status, body}
}

// Heal ends an outage that Fail or Hang began, and the answers of Answer.
func (g *Registry) Heal() {
	g.mu.Lock()
	h := g.heal
	g.fail, g.heal, g.answers = nil, nil, nil
	g.mu.Unlock()
	if h != nil {
		h()
	}
}

func (g *Registry) setFail(f func(w http.ResponseWriter, r *http.Request) bool) {
	g.mu.Lock()
	g.fail = f
	g.mu.Unlock()
}

// confluentError writes an error answer as Confluent's registry does.
func confluentError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error_code": code, "message": msg})
}

func (g *Registry) serve(w http.ResponseWriter, r *http.Request) {
	g.requests.Add(1)
	g.mu.Lock()
	fail := g.fail
	g.mu.Unlock()
	if fail != nil && fail(w, r) {
		g.failed.Add(1)
		return
	}
	parts := strings.Split(strings.Trim(r.URL.EscapedPath(), "/"), "/")
	if r.Method == http.MethodGet {
		g.mu.Lock()
		a, ok := g.answers[r.URL.EscapedPath()]
		g.mu.Unlock()
		if ok {
			g.failed.Add(1)
			w.WriteHeader(a.status)
			_, _ = w.Write([]byte(a.body))
			return
		}
	}
	if g.auth != nil && !g.auth(r) {
		confluentError(w, http.StatusUnauthorized, 40101, "Unauthorized")
		return
	}
	switch {
	case r.Method == http.MethodGet && len(parts) == 3 && parts[0] == "schemas" && parts[1] == "ids":
		id, _ := strconv.Atoi(parts[2])
		g.mu.Lock()
		s, ok := g.byID[id]
		g.mu.Unlock()
		if !ok {
			confluentError(w, http.StatusNotFound, 40403, "Schema "+parts[2]+" not found")
			return
		}
		writeJSON(w, s.Schema)
	case r.Method == http.MethodGet && len(parts) == 4 && parts[0] == "subjects" && parts[2] == "versions":
		g.mu.Lock()
		versions, ok := g.subjects[unescape(parts[1])]
		g.mu.Unlock()
		if !ok {
			confluentError(w, http.StatusNotFound, 40401, "Subject not found")
			return
		}
		v, err := strconv.Atoi(parts[3])
		if parts[3] == "latest" || v == -1 {
			v, err = len(versions), nil
		}
		if err != nil || v < 1 || v > len(versions) {
			confluentError(w, http.StatusNotFound, 40402, "Version not found")
			return
		}
		g.mu.Lock()
		s := g.byID[versions[v-1]]
		g.mu.Unlock()
		writeJSON(w, s)
	default:
		confluentError(w, http.StatusNotFound, 404, "HTTP 404 Not Found")
	}
}

func unescape(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	_ = json.NewEncoder(w).Encode(v)
}

// AvroEncoder returns the encoder a producer using franz-go's serde with
// hamba/avro has for schema id and its text: the Confluent header, then
// the Avro binary encoding of a value.
func AvroEncoder(tb testing.TB, id int, schema string) func(v any) []byte {
	tb.Helper()
	return AvroEncoderOf(tb, id, schema, map[string]any{})
}

// AvroEncoderOf is AvroEncoder for values of the Go type of example (a
// struct with avro tags, say), as a serde registers them.
func AvroEncoderOf(tb testing.TB, id int, schema string, example any) func(v any) []byte {
	tb.Helper()
	s, err := avro.Parse(schema)
	if err != nil {
		tb.Fatal(err)
	}
	var serde sr.Serde
	serde.Register(id, example, sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(s, v) }))
	return func(v any) []byte {
		b, err := serde.Encode(v)
		if err != nil {
			tb.Fatalf("encode %v with schema id %d: %v", v, id, err)
		}
		return b
	}
}
