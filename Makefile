# tidemark: the README's two commands are `make demo` and `make test`.
GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: demo test test-short bench lint build

## demo: embedded Kafka + throwaway PostgreSQL + the service, end to end
demo:
	$(GO) run ./cmd/tidemark demo

## test: every test, with the race detector, against real PostgreSQL and kfake
test:
	$(GO) test -race -timeout 20m ./...

## test-short: the same tests on smaller workloads
test-short:
	$(GO) test -short -timeout 10m ./...

## bench: throughput benchmarks with their in-run baselines (see docs/benchmarks.md)
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 90m ./bench/

## lint: formatting, vet and staticcheck
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

## build: the tidemark binary in bin/
build:
	$(GO) build -o bin/tidemark ./cmd/tidemark
