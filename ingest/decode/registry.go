package decode

import (
	"bytes"
	"container/list"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
)

// ErrRegistryUnavailable marks a failure to get a schema that is the
// registry's, not the record's: a connection error, a timeout, a 5xx or
// 429 answer, a 401 or 403 (ErrRegistryCredentials), a 404 without
// Confluent's error code 40403 (a wrong URL, a proxy), or an answer 200
// that is not a schema (an empty object, an HTML page, a body without the
// schema's text). The record is not dead-lettered but decoded again later.
var ErrRegistryUnavailable = errors.New("schema registry unavailable")

// ErrRegistryCredentials marks an answer 401 or 403: the registry refused
// the credentials of schema_registry.basic or schema_registry.bearer, or
// their absence. An error that wraps it wraps ErrRegistryUnavailable too.
var ErrRegistryCredentials = errors.New("the registry refused the credentials")

// Confluent's error codes that say a schema, a subject or a version does
// not exist.
const (
	codeSubjectNotFound = 40401
	codeVersionNotFound = 40402
	codeSchemaNotFound  = 40403
)

// MaxCachedSchemas bounds the schema ids a Registry keeps; the least
// recently used is evicted first. Schema ids are immutable, so a compiled
// schema never goes stale; the answers that records of an id are dead
// letters expire (unknownTTL, invalidTTL).
const MaxCachedSchemas = 4096

// unknownTTL is how long the registry's answer that a schema id, or a
// schema's reference, does not exist is kept: either can be registered
// later (a registry restored from a backup, or producers that ran ahead
// of a replicated registry).
const unknownTTL = time.Minute

// invalidTTL is how long a schema that does not compile, or whose type
// tidemark does not read, is kept. A registry never changes an id's
// schema, so the failure is lasting unless the registry, or a proxy in
// front of it, served the wrong text; asking again lets a repaired
// registry's schema load without a restart. A schema that truly does not
// compile costs, per expiry and whatever the number of its records, one
// request for the id, one per reference and one compilation.
const invalidTTL = 5 * time.Minute

// cacheClock is the time the cache's expiries are measured in (tests move it).
var cacheClock = time.Now

// wireHeader is the length of the Confluent wire-format header: the magic
// byte 0 and the schema id, 4 bytes big-endian.
const wireHeader = 5

// wireID returns the schema id of a value in the Confluent wire format
// and the bytes after the header, or ok false when v is not in it.
func wireID(v []byte) (id int, payload []byte, ok bool) {
	if len(v) < wireHeader || v[0] != 0 {
		return 0, nil, false
	}
	n := int32(binary.BigEndian.Uint32(v[1:wireHeader]))
	if n < 0 {
		return 0, nil, false
	}
	return int(n), v[wireHeader:], true
}

// schemaEntry is one schema id as the registry answered: its format and
// codec, or why records of it are dead letters.
type schemaEntry struct {
	id      int
	format  string // one of config.Format*
	codec   codec
	rej     *Rejection // unknown_schema or invalid_schema
	expires time.Time  // with rej: when to ask the registry again
}

// Registry gets schemas from a Confluent-compatible schema registry and
// keeps their codecs by schema id, at most MaxCachedSchemas of them. It is
// safe for concurrent use.
type Registry struct {
	cl       *sr.Client
	url      string // the base URL, for messages
	creds    string // the settings of the credentials sent, "" for none
	timeout  time.Duration
	answered atomic.Int64 // requests the registry answered

	mu    sync.Mutex
	lru   *list.List // of *schemaEntry, most recent first
	byID  map[int]*list.Element
	limit int
}

// NewRegistry returns the client of the configured registry. It does not
// connect until a schema is needed.
func NewRegistry(c config.SchemaRegistry) (*Registry, error) {
	tc := &tls.Config{ServerName: c.TLS.ServerName, InsecureSkipVerify: c.TLS.InsecureSkipVerify, MinVersion: tls.VersionTLS12} //nolint:gosec // opt-in by config
	if c.TLS.CAFile != "" {
		pem, err := os.ReadFile(c.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("schema_registry.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("schema_registry.tls.ca_file: no PEM certificates in %s", c.TLS.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.TLS.CertFile != "" {
		if _, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile); err != nil {
			return nil, fmt.Errorf("schema_registry.tls.cert_file: %w", err)
		}
		// Read at each handshake, so that a renewed certificate is used.
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
			return &cert, err
		}
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tc
	opts := []sr.ClientOpt{
		sr.URLs(c.URL),
		sr.HTTPClient(&http.Client{Transport: transport, Timeout: c.Timeout.Duration()}),
		sr.UserAgent("tidemark"),
	}
	if b := c.Basic; b.Username != "" {
		opts = append(opts, sr.BasicAuth(b.Username, b.Password))
	}
	if f := c.Bearer.TokenFile; f != "" {
		opts = append(opts, sr.PreReq(func(req *http.Request) error {
			tok, err := config.ReadTokenFile(f)
			if err != nil {
				return fmt.Errorf("schema_registry.bearer.token_file: %w", err)
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			return nil
		}))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("schema_registry: %w", err)
	}
	timeout := c.Timeout.Duration()
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	var creds string
	switch {
	case c.Basic.Username != "":
		creds = fmt.Sprintf("schema_registry.basic (username %q)", c.Basic.Username)
	case c.Bearer.TokenFile != "":
		creds = "schema_registry.bearer (token_file " + c.Bearer.TokenFile + ")"
	}
	return &Registry{cl: cl, url: strings.TrimSuffix(c.URL, "/"), creds: creds, timeout: timeout,
		lru: list.New(), byID: map[int]*list.Element{}, limit: MaxCachedSchemas}, nil
}

// Answered counts the requests the registry answered, with a schema or
// with Confluent's word that it does not exist: a caller tells from it
// that the registry is reachable again.
func (g *Registry) Answered() int64 { return g.answered.Load() }

// Len is the number of schemas cached.
func (g *Registry) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lru.Len()
}

// cached returns the entry of id if it is cached and current.
func (g *Registry) cached(id int) *schemaEntry {
	g.mu.Lock()
	defer g.mu.Unlock()
	el := g.byID[id]
	if el == nil {
		return nil
	}
	e := el.Value.(*schemaEntry)
	if !e.expires.IsZero() && cacheClock().After(e.expires) {
		g.lru.Remove(el)
		delete(g.byID, id)
		return nil
	}
	g.lru.MoveToFront(el)
	return e
}

func (g *Registry) store(e *schemaEntry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if el := g.byID[e.id]; el != nil {
		el.Value = e
		g.lru.MoveToFront(el)
		return
	}
	g.byID[e.id] = g.lru.PushFront(e)
	for g.lru.Len() > g.limit {
		old := g.lru.Back()
		g.lru.Remove(old)
		delete(g.byID, old.Value.(*schemaEntry).id)
	}
}

// schema returns the entry of schema id, from the cache or the registry.
// An error wraps ErrRegistryUnavailable: the registry could not say.
func (g *Registry) schema(ctx context.Context, id int) (*schemaEntry, error) {
	if e := g.cached(id); e != nil {
		return e, nil
	}
	e, err := g.fetch(ctx, id)
	if err != nil {
		return nil, err
	}
	g.store(e)
	return e, nil
}

// fetch asks the registry for schema id and its references and compiles
// it.
func (g *Registry) fetch(ctx context.Context, id int) (*schemaEntry, error) {
	e := &schemaEntry{id: id}
	what := "schema id " + strconv.Itoa(id)
	s, err := g.get(ctx, "/schemas/ids/"+strconv.Itoa(id))
	if err == nil || registryCode(err) == codeSchemaNotFound {
		g.answered.Add(1)
	}
	if err != nil {
		if registryCode(err) == codeSchemaNotFound {
			e.rej = &Rejection{ReasonUnknownSchema, fmt.Sprintf("schema id %d does not exist in the registry", id)}
			e.expires = cacheClock().Add(unknownTTL)
			return e, nil
		}
		return nil, g.unavailable(ctx, what, err)
	}
	var refs []schemaRef
	if bad, err := g.references(ctx, s.References, map[string]bool{}, &refs); err != nil {
		return nil, err
	} else if bad != "" {
		// A reference registered later makes the schema good: ask again
		// after a while, as for an unknown id.
		e.rej = &Rejection{ReasonInvalidSchema, fmt.Sprintf("schema id %d: %s", id, bad)}
		e.expires = cacheClock().Add(unknownTTL)
		return e, nil
	}
	var compile func(string, []schemaRef) (codec, error)
	switch strings.ToUpper(s.Type) {
	case "", "AVRO":
		e.format, compile = config.FormatAvro, compileAvro
	case "PROTOBUF":
		e.format, compile = config.FormatProtobuf, compileProtobuf
	case "JSON":
		e.format, compile = config.FormatJSONSchema, compileJSONSchema
	default:
		e.rej = &Rejection{ReasonInvalidSchema, fmt.Sprintf("schema id %d has the type %s, which tidemark does not read", id, s.Type)}
		e.expires = cacheClock().Add(invalidTTL)
		return e, nil
	}
	if e.codec, err = compile(s.Schema, refs); err != nil {
		e.rej = &Rejection{ReasonInvalidSchema, fmt.Sprintf("schema id %d (%s): %v", id, e.format, err)}
		e.expires = cacheClock().Add(invalidTTL)
	}
	return e, nil
}

// schemaAnswer is the registry's answer with a schema, read strictly: the
// fields tidemark uses of Confluent's answers to /schemas/ids/{id} and
// /subjects/{subject}/versions/{version}.
type schemaAnswer struct {
	Schema     string
	Type       string // schemaType: AVRO when empty
	References []sr.SchemaReference
}

// notSchemaError is an answer 200 that is not a schema: the registry, or
// a proxy in front of it, did not answer the question asked.
type notSchemaError struct {
	url  string
	why  string
	body []byte
}

func (e *notSchemaError) Error() string {
	return fmt.Sprintf("HTTP 200 from %s is not a schema (%s): %q", e.url, e.why, truncate(e.body, 200))
}

// get asks the registry for the schema at path, bounded by the request
// timeout. An answer 200 is a schema only if it is a JSON object whose
// "schema" is a non-empty string and whose other fields tidemark reads
// have their types; any other is a *notSchemaError. Fields tidemark does
// not read are ignored, as registries add some over versions.
func (g *Registry) get(ctx context.Context, path string) (schemaAnswer, error) {
	rctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	var body []byte
	if err := g.cl.Do(rctx, http.MethodGet, path, nil, &body); err != nil {
		return schemaAnswer{}, err
	}
	var a struct {
		Schema     *string              `json:"schema"`
		Type       *string              `json:"schemaType"`
		References []sr.SchemaReference `json:"references"`
	}
	bad := func(why string) (schemaAnswer, error) {
		return schemaAnswer{}, &notSchemaError{url: g.url + path, why: why, body: body}
	}
	trimmed := bytes.TrimSpace(body)
	switch {
	case len(trimmed) == 0 || trimmed[0] != '{':
		return bad("not a JSON object")
	case json.Unmarshal(trimmed, &a) != nil:
		return bad("not a schema object")
	case a.Schema == nil:
		return bad(`no "schema"`)
	case strings.TrimSpace(*a.Schema) == "":
		return bad(`an empty "schema"`)
	}
	s := schemaAnswer{Schema: *a.Schema, References: a.References}
	if a.Type != nil {
		s.Type = *a.Type
	}
	return s, nil
}

// references appends the schemas refs name, each after those it
// references in turn, to out. It returns why the schema is invalid when a
// reference does not exist.
func (g *Registry) references(ctx context.Context, refs []sr.SchemaReference, seen map[string]bool, out *[]schemaRef) (string, error) {
	for _, ref := range refs {
		key := ref.Subject + "\x00" + strconv.Itoa(ref.Version)
		if seen[key] {
			continue
		}
		seen[key] = true
		s, err := g.get(ctx, "/subjects/"+url.PathEscape(ref.Subject)+"/versions/"+strconv.Itoa(ref.Version))
		if code := registryCode(err); err == nil || code == codeSubjectNotFound || code == codeVersionNotFound || code == codeSchemaNotFound {
			g.answered.Add(1)
		}
		if code := registryCode(err); code == codeSubjectNotFound || code == codeVersionNotFound || code == codeSchemaNotFound {
			return fmt.Sprintf("the reference %s (subject %s, version %d) does not exist in the registry", ref.Name, ref.Subject, ref.Version), nil
		}
		if err != nil {
			return "", g.unavailable(ctx, fmt.Sprintf("reference %s (subject %s, version %d)", ref.Name, ref.Subject, ref.Version), err)
		}
		if bad, err := g.references(ctx, s.References, seen, out); bad != "" || err != nil {
			return bad, err
		}
		*out = append(*out, schemaRef{Name: ref.Name, Schema: s.Schema})
	}
	return "", nil
}

// registryCode is Confluent's error code of a 404 answer, 0 for any other
// error: only a 404 with a code says that something does not exist.
func registryCode(err error) int {
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
		return re.ErrorCode
	}
	return 0
}

// unavailable wraps a failed request as ErrRegistryUnavailable, saying
// what was asked and, for an HTTP answer, its status; a 401 or 403 wraps
// ErrRegistryCredentials too and names the settings to check.
func (g *Registry) unavailable(ctx context.Context, what string, err error) error {
	var re *sr.ResponseError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %s: %w", ErrRegistryUnavailable, what, ctx.Err())
	case errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden):
		return fmt.Errorf("%w: %s: %w (HTTP %d from %s: %s); %s", ErrRegistryUnavailable, what, ErrRegistryCredentials,
			re.StatusCode, re.URL, truncate([]byte(re.Error()), 200), g.credentialsHint(re.StatusCode))
	case errors.As(err, &re):
		return fmt.Errorf("%w: %s: HTTP %d from %s: %s", ErrRegistryUnavailable, what, re.StatusCode, re.URL, truncate([]byte(re.Error()), 200))
	}
	return fmt.Errorf("%w: %s: %w", ErrRegistryUnavailable, what, err)
}

// credentialsHint says what to change when the registry answered status
// 401 or 403.
func (g *Registry) credentialsHint(status int) string {
	switch {
	case g.creds == "":
		return "no credentials are configured: set schema_registry.basic or schema_registry.bearer"
	case status == http.StatusForbidden:
		return "the credentials of " + g.creds + " may not read this schema: grant them read access at the registry, or configure others"
	}
	return "check " + g.creds
}

// Schemas are the registry schemas that a set of records needs, resolved
// by Decoder.Resolve.
type Schemas map[int]*schemaEntry

// Has reports whether r can be decoded with s: its value is not in the
// wire format (a wrong_format dead letter) or s holds its schema.
func (s Schemas) Has(r *kgo.Record) bool {
	id, _, ok := wireID(r.Value)
	return !ok || s[id] != nil
}
