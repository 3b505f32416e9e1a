# roost's build. `make demo` runs the daemon on a temporary state dir with the example
# capsules; `make test` runs every check CI runs.

GO      ?= go
# libcontainer's seccomp support is behind the seccomp build tag (and needs libseccomp-dev).
export GOFLAGS := -tags=seccomp $(GOFLAGS)
TOOLS   := $(CURDIR)/.tools/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS := -X roost.dev/roost/pkg/version.Version=$(VERSION) -X roost.dev/roost/pkg/version.Commit=$(COMMIT)

.PHONY: all deps sdk build test unit e2e lint vet staticcheck fmt-check proto proto-check buf-lint demo bench fuzz tools clean

all: build

build: deps
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/roostd ./cmd/roostctl
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o bin/ ./cmd/roost-init
	CGO_ENABLED=1 $(GO) build -trimpath -o bin/ ./cmd/roost-wasm

## deps: what building roostd needs beyond Go: libseccomp's headers, for libcontainer.
deps:
	@pkg-config --exists libseccomp 2>/dev/null || { echo "installing libseccomp-dev"; \
		apt-get install -y -qq libseccomp-dev pkg-config || { apt-get update -qq && apt-get install -y -qq libseccomp-dev pkg-config; }; }
	@command -v curl >/dev/null && command -v python3 >/dev/null || { echo "installing curl and python3"; \
		apt-get install -y -qq curl python3 || { apt-get update -qq && apt-get install -y -qq curl python3; }; }

## test: everything CI checks: formatting, vet, staticcheck, the API lint and freshness of the
## generated code, unit tests (with the race detector) and the end-to-end tests.
test: lint unit e2e

unit: deps
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /test/e2e)

e2e: deps sdk
	$(GO) test -count=1 ./test/e2e/

## sdk: the official OpenAI and Anthropic SDKs that TestOfficialSDKs runs in sealed sessions,
## installed exactly as test/e2e/sdk/package-lock.json pins them (npm ci) when node_modules is
## missing or older than package.json or the lockfile; node and npm come from apt when missing.
SDK_DIR := test/e2e/sdk

sdk: $(SDK_DIR)/node_modules/.package-lock.json

$(SDK_DIR)/node_modules/.package-lock.json: $(SDK_DIR)/package.json $(SDK_DIR)/package-lock.json
	@command -v node >/dev/null || { echo "installing nodejs"; export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq nodejs || { apt-get update -qq && apt-get install -y -qq nodejs; }; }
	@command -v npm >/dev/null || { echo "installing npm"; export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq npm || { apt-get update -qq && apt-get install -y -qq npm; }; }
	@node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' || \
		echo "warning: node $$(node --version): the pinned SDKs support Node 20 and later" >&2
	cd $(SDK_DIR) && npm ci --no-audit --no-fund
	@touch $@

lint: deps fmt-check vet staticcheck buf-lint proto-check

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.tools/*')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck: $(TOOLS)/staticcheck
	$(TOOLS)/staticcheck ./...

buf-lint: $(TOOLS)/buf
	$(TOOLS)/buf lint

## proto: regenerate api/gen from api/proto with the plugin versions go.mod pins.
proto: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc
	rm -rf api/gen/roost
	PATH=$(TOOLS):$$PATH $(TOOLS)/buf generate

## proto-check: fail when the committed generated code is not what the protos generate.
proto-check: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	PATH=$(TOOLS):$$PATH $(TOOLS)/buf generate -o $$tmp && \
	if ! diff -r $$tmp/api/gen api/gen; then echo "api/gen is stale: run make proto and commit the result"; exit 1; fi

demo: deps build
	./scripts/demo.sh

## bench: the benchmarks whose numbers the README quotes.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./pkg/manifest/ ./pkg/session/ ./pkg/server/ ./pkg/spawn/ ./pkg/ledger/ ./pkg/workdir/

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 60s -fuzzminimizetime 5s ./pkg/manifest/
	$(GO) test -run '^$$' -fuzz '^FuzzParseNetRule$$' -fuzztime 20s -fuzzminimizetime 5s ./pkg/manifest/
	$(GO) test -run '^$$' -fuzz FuzzVerify -fuzztime 20s -fuzzminimizetime 5s ./pkg/spawn/
	$(GO) test -run '^$$' -fuzz FuzzUsage -fuzztime 20s -fuzzminimizetime 5s ./pkg/gateway/
	$(GO) test -run '^$$' -fuzz FuzzPrepare -fuzztime 20s -fuzzminimizetime 5s ./pkg/gateway/
	$(GO) test -run '^$$' -fuzz FuzzRoute -fuzztime 20s -fuzzminimizetime 5s ./pkg/gateway/
	$(GO) test -run '^$$' -fuzz FuzzSOCKSRequest -fuzztime 20s -fuzzminimizetime 5s ./pkg/egress/
	$(GO) test -run '^$$' -fuzz FuzzAuthority -fuzztime 20s -fuzzminimizetime 5s ./pkg/egress/
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 20s -fuzzminimizetime 5s ./pkg/config/
	$(GO) test -run '^$$' -fuzz FuzzInterpreters -fuzztime 20s -fuzzminimizetime 5s ./pkg/containment/roostinit/

tools: $(TOOLS)/buf $(TOOLS)/staticcheck $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc

# buf and staticcheck are pinned in tools/go.mod (buf needs a newer protobuf than roost's);
# the protoc plugins are pinned by roost's own go.mod, matching the runtime they generate for.
$(TOOLS)/buf $(TOOLS)/staticcheck: tools/go.mod tools/go.sum
	cd tools && GOBIN=$(TOOLS) $(GO) install github.com/bufbuild/buf/cmd/buf honnef.co/go/tools/cmd/staticcheck

$(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc: go.mod go.sum
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

clean:
	rm -rf bin .tools
