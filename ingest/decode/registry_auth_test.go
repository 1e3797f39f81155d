package decode_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/testcert"
)

// TestRegistryAuthAndTLS reaches a registry that wants TLS with a client
// certificate and basic or bearer authentication, as schema_registry's
// keys configure it: the right credentials decode, the wrong ones are an
// outage (never a dead letter) that says why, and a rotated token file is
// read at the next request.
func TestRegistryAuthAndTLS(t *testing.T) {
	ca := testcert.NewCA(t, "registry-ca")
	server, client := ca.Server(t, "127.0.0.1"), ca.Client(t, "tidemark")
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(ca.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(pem)
	token := "t-1"
	g := srtest.NewWith(t, srtest.Options{
		TLS: &tls.Config{Certificates: []tls.Certificate{server.TLS}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
			MinVersion: tls.VersionTLS12},
		Auth: func(r *http.Request) bool {
			if u, p, ok := r.BasicAuth(); ok {
				return u == "reader" && p == "s3cret"
			}
			return r.Header.Get("Authorization") == "Bearer "+token
		},
	})
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeToken := func(tok string) {
		t.Helper()
		if err := os.WriteFile(tokenFile, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeToken("t-1")
	goodTLS := config.RegistryTLS{CAFile: ca.CAFile, CertFile: client.CertFile, KeyFile: client.KeyFile}

	// Each resolution asks for a schema id not asked before: the cache
	// would answer otherwise.
	next := 0
	resolve := func(t *testing.T, c config.SchemaRegistry) error {
		t.Helper()
		next++
		id := g.Register(fmt.Sprintf("s%d-value", next), sr.Schema{Schema: orderSchema})
		c.URL, c.Timeout = g.URL(), config.Duration(2*time.Second)
		reg, err := decode.NewRegistry(c)
		if err != nil {
			t.Fatal(err)
		}
		d, err := decode.NewRegistryDecoder(&config.Source{Name: "orders", Format: config.FormatAvro, EventID: "/id", EventTime: "/ts",
			EventTimeFormat: config.TimeAuto, MaxAge: config.Duration(24 * time.Hour), MaxFutureSkew: config.Duration(time.Hour)}, reg)
		if err != nil {
			t.Fatal(err)
		}
		r := &kgo.Record{Value: srtest.AvroEncoder(t, id, orderSchema)(map[string]any{"id": "o-1", "ts": regNow})}
		s, err := d.Resolve(context.Background(), []*kgo.Record{r})
		if err != nil {
			return err
		}
		if _, rej := d.DecodeWith(r, regNow, s); rej != nil {
			t.Fatalf("decoded: %+v", rej)
		}
		return nil
	}
	tests := []struct {
		name string
		c    config.SchemaRegistry
		want string // "" decodes; else the outage's text
	}{
		{"basic", config.SchemaRegistry{Basic: config.RegistryBasic{Username: "reader", Password: "s3cret"}, TLS: goodTLS}, ""},
		{"bearer", config.SchemaRegistry{Bearer: config.RegistryBearer{TokenFile: tokenFile}, TLS: goodTLS}, ""},
		{"wrong password", config.SchemaRegistry{Basic: config.RegistryBasic{Username: "reader", Password: "nope"}, TLS: goodTLS}, "HTTP 401"},
		{"no credentials", config.SchemaRegistry{TLS: goodTLS}, "HTTP 401"},
		{"no client certificate", config.SchemaRegistry{Basic: config.RegistryBasic{Username: "reader", Password: "s3cret"},
			TLS: config.RegistryTLS{CAFile: ca.CAFile}}, "certificate"},
		{"unknown authority", config.SchemaRegistry{Basic: config.RegistryBasic{Username: "reader", Password: "s3cret"},
			TLS: config.RegistryTLS{CertFile: client.CertFile, KeyFile: client.KeyFile}}, "certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := resolve(t, tt.c)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Resolve: %v", err)
			case tt.want != "" && (!errors.Is(err, decode.ErrRegistryUnavailable) || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Resolve: %v, want ErrRegistryUnavailable saying %q", err, tt.want)
			}
		})
	}

	t.Run("rotated token", func(t *testing.T) {
		c := config.SchemaRegistry{Bearer: config.RegistryBearer{TokenFile: tokenFile}, TLS: goodTLS}
		token = "t-2" // the registry now wants the new token
		if err := resolve(t, c); !errors.Is(err, decode.ErrRegistryUnavailable) {
			t.Fatalf("with the old token in the file: %v, want an outage", err)
		}
		writeToken("t-2")
		if err := resolve(t, c); err != nil {
			t.Fatalf("with the rotated token: %v", err)
		}
	})
}

// TestRegistryRefusedCredentials checks that a 401 or 403 is an outage
// that says the registry refused the credentials and names the settings
// to check, and that other failures do not say so.
func TestRegistryRefusedCredentials(t *testing.T) {
	g := srtest.NewWith(t, srtest.Options{Auth: func(r *http.Request) bool {
		u, p, ok := r.BasicAuth()
		return ok && u == "reader" && p == "s3cret"
	}})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("t-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := config.SchemaRegistry{Basic: config.RegistryBasic{Username: "reader", Password: "s3cret"}}
	tests := []struct {
		name  string
		c     config.SchemaRegistry
		fail  func(id int) // the registry's answer, when not its own
		creds bool         // wraps ErrRegistryCredentials
		says  string
	}{
		{"wrong password", config.SchemaRegistry{Basic: config.RegistryBasic{Username: "reader", Password: "nope"}}, nil, true,
			`the registry refused the credentials (HTTP 401 from ` + g.URL() + `/schemas/ids/%d: Unauthorized); check schema_registry.basic (username "reader")`},
		{"refused token", config.SchemaRegistry{Bearer: config.RegistryBearer{TokenFile: tokenFile}}, nil, true,
			"the registry refused the credentials (HTTP 401 from " + g.URL() + "/schemas/ids/%d: Unauthorized); check schema_registry.bearer (token_file " + tokenFile + ")"},
		{"no credentials", config.SchemaRegistry{}, nil, true,
			"no credentials are configured: set schema_registry.basic or schema_registry.bearer"},
		{"forbidden", good, func(id int) {
			g.Answer(id, http.StatusForbidden, `{"error_code":40301,"message":"User cannot access the resource."}`)
		}, true,
			`the registry refused the credentials (HTTP 403 from ` + g.URL() + `/schemas/ids/%d: User cannot access the resource.); the credentials of schema_registry.basic (username "reader") may not read this schema`},
		{"unavailable", good, func(id int) { g.Answer(id, http.StatusServiceUnavailable, "down") }, false, "HTTP 503"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := g.Register(tt.name+"-value", sr.Schema{Schema: orderSchema})
			if tt.fail != nil {
				tt.fail(id)
				defer g.Heal()
			}
			tt.c.URL, tt.c.Timeout = g.URL(), config.Duration(2*time.Second)
			reg, err := decode.NewRegistry(tt.c)
			if err != nil {
				t.Fatal(err)
			}
			d, err := decode.NewRegistryDecoder(&config.Source{Name: "orders", Format: config.FormatAvro, EventID: "/id", EventTime: "/ts",
				EventTimeFormat: config.TimeAuto, MaxAge: config.Duration(24 * time.Hour), MaxFutureSkew: config.Duration(time.Hour)}, reg)
			if err != nil {
				t.Fatal(err)
			}
			r := &kgo.Record{Value: srtest.AvroEncoder(t, id, orderSchema)(map[string]any{"id": "o-1", "ts": regNow})}
			_, err = d.Resolve(context.Background(), []*kgo.Record{r})
			says := tt.says
			if strings.Contains(says, "%d") {
				says = fmt.Sprintf(says, id)
			}
			if !errors.Is(err, decode.ErrRegistryUnavailable) || errors.Is(err, decode.ErrRegistryCredentials) != tt.creds ||
				!strings.Contains(err.Error(), says) {
				t.Errorf("Resolve: %v\nwant ErrRegistryUnavailable (credentials %v) saying %q", err, tt.creds, says)
			}
		})
	}
}
