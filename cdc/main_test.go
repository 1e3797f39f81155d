package cdc_test

import (
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
