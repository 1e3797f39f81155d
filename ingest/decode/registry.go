package decode

import (
	"container/list"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
)

// ErrRegistryUnavailable marks a failure to get a schema that is the
// registry's, not the record's: a connection error, a timeout, a 5xx or
// 429 answer, a 404 without Confluent's error code 40403 (a wrong URL, a
// proxy). The record is not dead-lettered but decoded again later.
var ErrRegistryUnavailable = errors.New("schema registry unavailable")

// Confluent's error codes that say a schema, a subject or a version does
// not exist.
const (
	codeSubjectNotFound = 40401
	codeVersionNotFound = 40402
	codeSchemaNotFound  = 40403
)

// MaxCachedSchemas bounds the compiled schemas a Registry keeps; the least
// recently used is evicted first. Schema ids are immutable, so an entry
// never goes stale.
const MaxCachedSchemas = 4096

// unknownTTL is how long the registry's answer that a schema id, or a
// schema's reference, does not exist is kept: either can be registered
// later (a registry restored from a backup, or producers that ran ahead
// of a replicated registry).
const unknownTTL = time.Minute

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
	expires time.Time  // for unknown_schema: when to ask again
}

// Registry gets schemas from a Confluent-compatible schema registry and
// keeps their codecs by schema id, at most MaxCachedSchemas of them. It is
// safe for concurrent use.
type Registry struct {
	cl       *sr.Client
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
		sr.HTTPClient(&http.Client{Transport: transport, Timeout: c.Timeout.D()}),
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
	timeout := c.Timeout.D()
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return &Registry{cl: cl, timeout: timeout, lru: list.New(), byID: map[int]*list.Element{}, limit: MaxCachedSchemas}, nil
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
	rctx, cancel := context.WithTimeout(ctx, g.timeout)
	s, err := g.cl.SchemaByID(rctx, id)
	cancel()
	if err == nil || registryCode(err) == codeSchemaNotFound {
		g.answered.Add(1)
	}
	if err != nil {
		if registryCode(err) == codeSchemaNotFound {
			e.rej = &Rejection{ReasonUnknownSchema, fmt.Sprintf("schema id %d does not exist in the registry", id)}
			e.expires = cacheClock().Add(unknownTTL)
			return e, nil
		}
		return nil, unavailable(ctx, "schema id "+strconv.Itoa(id), err)
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
	switch s.Type {
	case sr.TypeAvro:
		e.format, compile = config.FormatAvro, compileAvro
	case sr.TypeProtobuf:
		e.format, compile = config.FormatProtobuf, compileProtobuf
	case sr.TypeJSON:
		e.format, compile = config.FormatJSONSchema, compileJSONSchema
	default:
		e.rej = &Rejection{ReasonInvalidSchema, fmt.Sprintf("schema id %d has the type %s, which tidemark does not read", id, s.Type)}
		return e, nil
	}
	if e.codec, err = compile(s.Schema, refs); err != nil {
		e.rej = &Rejection{ReasonInvalidSchema, fmt.Sprintf("schema id %d (%s): %v", id, e.format, err)}
	}
	return e, nil
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
		rctx, cancel := context.WithTimeout(ctx, g.timeout)
		s, err := g.cl.SchemaByVersion(rctx, ref.Subject, ref.Version)
		cancel()
		if code := registryCode(err); err == nil || code == codeSubjectNotFound || code == codeVersionNotFound || code == codeSchemaNotFound {
			g.answered.Add(1)
		}
		if code := registryCode(err); code == codeSubjectNotFound || code == codeVersionNotFound || code == codeSchemaNotFound {
			return fmt.Sprintf("the reference %s (subject %s, version %d) does not exist in the registry", ref.Name, ref.Subject, ref.Version), nil
		}
		if err != nil {
			return "", unavailable(ctx, fmt.Sprintf("reference %s (subject %s, version %d)", ref.Name, ref.Subject, ref.Version), err)
		}
		if bad, err := g.references(ctx, s.References, seen, out); bad != "" || err != nil {
			return bad, err
		}
		*out = append(*out, schemaRef{Name: ref.Name, Schema: s.Schema.Schema})
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
// what was asked and, for an HTTP answer, its status.
func unavailable(ctx context.Context, what string, err error) error {
	var re *sr.ResponseError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %s: %w", ErrRegistryUnavailable, what, ctx.Err())
	case errors.As(err, &re):
		return fmt.Errorf("%w: %s: HTTP %d from %s: %s", ErrRegistryUnavailable, what, re.StatusCode, re.URL, truncate([]byte(re.Error()), 200))
	}
	return fmt.Errorf("%w: %s: %w", ErrRegistryUnavailable, what, err)
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
