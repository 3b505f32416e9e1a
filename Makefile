# roost's build. `make demo` runs the daemon on a temporary state dir with the example
# capsules; `make test` runs every check CI runs.

GO      ?= go
# libcontainer's seccomp support is behind the seccomp build tag (and needs libseccomp-dev).
export GOFLAGS := -tags=seccomp $(GOFLAGS)
TOOLS   := $(CURDIR)/.tools/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS := -X roost.dev/roost/pkg/version.Version=$(VERSION) -X roost.dev/roost/pkg/version.Commit=$(COMMIT)

# Where make install puts things: $(DESTDIR)$(PREFIX)/bin, $(DESTDIR)$(PREFIX)/share/doc/roost,
# $(DESTDIR)/lib/systemd/system and $(DESTDIR)/etc/roost. INSTALL_FROM is where it takes the
# binaries from (make build puts them in bin/).
PREFIX  ?= /usr/local
DESTDIR ?=
INSTALL_FROM ?= bin
UNITDIR := /lib/systemd/system
CONFDIR := /etc/roost
DOCDIR  := $(PREFIX)/share/doc/roost
INSTALL_BINS := roostd roostctl roost-init roost-sealer roost-wasm

.PHONY: all deps rust-wasi sdk agent-clis build man test unit e2e lint vet staticcheck fmt-check proto proto-check buf-lint demo bench fuzz tools clean install install-check buf-breaking api-baseline tidy-check deploy-check tracked-check sdk-clients sdk-gen sdk-gen-deps sdk-gen-check

all: build

build: deps
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/roostd
	# roostctl starts once per command: built without cgo it skips the dynamic loader and
	# libc, a fifth of its start (bench/sealed.sh).
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/roostctl
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags "-s -w" -o bin/ ./cmd/roost-sealer
	@rm -rf bin/man && SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || date +%s) \
		$(GO) run ./cmd/roostctl/internal/mangen bin/man
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o bin/ ./cmd/roost-init
	CGO_ENABLED=1 $(GO) build -trimpath -o bin/ ./cmd/roost-wasm
	# etcd's server at the version go.mod pins, for fleets and the tests that run etcd as
	# processes (docs/fleet.md); roostd itself carries only etcd's client.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o bin/ ./cmd/roost-etcd

## man: roostctl's man pages, one per command, generated from its command tree into bin/man
## by make build (make install puts them under $(PREFIX)/share/man/man1). Dated by the last
## commit, so the same tree gives the same pages. roostd.8 and capsule.yaml.5 are written in
## man/; the tests of cmd/roostd, pkg/config and pkg/manifest hold them to the flags and keys.
man: build

## deps: what building roostd needs beyond Go: libseccomp's headers, for libcontainer.
deps:
	@pkg-config --exists libseccomp 2>/dev/null || { echo "installing libseccomp-dev"; \
		apt-get install -y -qq libseccomp-dev pkg-config || { apt-get update -qq && apt-get install -y -qq libseccomp-dev pkg-config; }; }
	@command -v curl >/dev/null && command -v python3 >/dev/null || { echo "installing curl and python3"; \
		apt-get install -y -qq curl python3 || { apt-get update -qq && apt-get install -y -qq curl python3; }; }

## rust-wasi: what TestMemoryCapRustGuest builds its Rust guest with: Debian's rustc, its
## WASI standard library (libstd-rust-dev-wasm32) and lld (rustc's /usr/bin/rust-lld is a
## link to it, dangling without it).
RUST_WASI_PKGS := rustc libstd-rust-dev-wasm32 lld
rust-wasi:
	@[ -x /usr/bin/rustc ] && [ -x /usr/bin/rust-lld ] && { [ -d /usr/lib/rustlib/wasm32-wasip1 ] || [ -d /usr/lib/rustlib/wasm32-wasi ]; } || \
		{ echo "installing $(RUST_WASI_PKGS)"; export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq $(RUST_WASI_PKGS) || { apt-get update -qq && apt-get install -y -qq $(RUST_WASI_PKGS); }; }

## test: everything CI checks: formatting, vet, staticcheck, the API lint and freshness of the
## generated code, unit tests (with the race detector) and the end-to-end tests.
test: lint unit e2e demo install-check

unit: deps rust-wasi
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /test/e2e)
	# The sealed and hostile suites again, each session in a sandbox made ahead (--warm-pool).
	$(GO) test -race -count=1 -run 'Sealed|Hostile|Trust|Exec|Socketpair|Workdir' $(WARM_PACKAGES) -args -warm
	# The races against an unprivileged attacker at their acceptance count, without the race
	# detector: it has no part in a race between two processes, and slows each push.
	$(GO) test -count=1 -run 'TestAttacker' ./pkg/artifact/ -args -race.pushes=2000

# The packages whose tests take -warm (internal/testkit's Kit.Main): every one that holds
# tests of the runtimes.
WARM_PACKAGES := ./pkg/containment/ ./pkg/containment/scoped/ ./pkg/containment/sealed/

e2e: deps sdk sdk-clients agent-clis $(TOOLS)/grpcurl
	$(GO) test -count=1 -timeout 40m ./test/e2e/
	# The suites of sealed sessions again, against daemons keeping warm sandboxes.
	ROOST_E2E_WARM_POOL=2 $(GO) test -count=1 -timeout 40m -run '$(WARM_SUITES)' ./test/e2e/

WARM_SUITES := Sealed|Delegation|Spawn|KillParent|Identity|Trust|Exec|Egress|Bounds|Names|Stats|Logs|Five|Officials|SDK

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

## sdk-clients: what roost's own SDKs (sdk/, docs/sdk.md) need for their tests, which
## TestClientLibraries runs: sdk/typescript's packages as its package-lock.json pins them (npm
## ci), and Debian's grpcio and protobuf for sdk/python under Debian's python3.
SDK_TS       := sdk/typescript
SDK_PY_PKGS  := python3-grpcio python3-protobuf
SDK_GEN_PKGS := protobuf-compiler protobuf-compiler-grpc

sdk-clients: $(SDK_TS)/node_modules/.package-lock.json
	@/usr/bin/python3 -c 'import grpc, google.protobuf' 2>/dev/null || { echo "installing $(SDK_PY_PKGS)"; \
		export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq $(SDK_PY_PKGS) || \
		{ apt-get update -qq && apt-get install -y -qq $(SDK_PY_PKGS); }; }

$(SDK_TS)/node_modules/.package-lock.json: $(SDK_TS)/package.json $(SDK_TS)/package-lock.json
	cd $(SDK_TS) && npm ci --no-audit --no-fund
	@touch $@

## sdk-gen: regenerate the SDKs' code from api/proto, which is committed as api/gen is:
## sdk/typescript/gen with the protoc-gen-es its package-lock.json pins (through buf), and
## sdk/python/roost/v1 with Debian's protoc and grpc_python_plugin, matching the
## python3-protobuf and python3-grpcio it runs on.
SDK_PY_GEN = protoc -I api/proto --python_out=$(1) --grpc_python_out=$(1) \
	--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin api/proto/roost/v1/*.proto

sdk-gen-deps: $(TOOLS)/buf $(SDK_TS)/node_modules/.package-lock.json
	@command -v protoc >/dev/null && [ -x /usr/bin/grpc_python_plugin ] || { echo "installing $(SDK_GEN_PKGS)"; \
		export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq $(SDK_GEN_PKGS) || \
		{ apt-get update -qq && apt-get install -y -qq $(SDK_GEN_PKGS); }; }

sdk-gen: sdk-gen-deps
	rm -rf $(SDK_TS)/gen sdk/python/roost/v1/*_pb2*.py
	$(TOOLS)/buf generate --template $(SDK_TS)/buf.gen.yaml
	$(call SDK_PY_GEN,sdk/python)

## sdk-gen-check: fail when the SDKs' committed generated code is not what the protos generate.
sdk-gen-check: sdk-gen-deps
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	mkdir -p $$tmp/sdk/python && $(TOOLS)/buf generate --template $(SDK_TS)/buf.gen.yaml -o $$tmp && \
	$(call SDK_PY_GEN,$$tmp/sdk/python) && \
	if ! diff -r $$tmp/$(SDK_TS)/gen $(SDK_TS)/gen || ! diff -r -x __init__.py -x __pycache__ $$tmp/sdk/python/roost/v1 sdk/python/roost/v1; then \
		echo "the SDKs' generated code is stale: run make sdk-gen and commit the result"; exit 1; fi

## agent-clis: the coding agents' CLIs that test/e2e runs as capsules (agents_*_test.go), at the
## versions pinned here, installed with npm install -g (into the system trees, where an
## operator's npm puts them) when missing or at another version.
CLAUDE_CODE_VERSION := 2.1.197
CODEX_VERSION       := 0.171.0

agent-clis:
	@[ "$$(claude --version 2>/dev/null)" = "$(CLAUDE_CODE_VERSION) (Claude Code)" ] || { \
		echo "installing @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)"; \
		npm install -g --no-fund --no-audit @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) >/dev/null; }
	@[ "$$(codex --version 2>/dev/null)" = "codex-cli $(CODEX_VERSION)" ] || { \
		echo "installing @openai/codex@$(CODEX_VERSION)"; \
		npm install -g --no-fund --no-audit @openai/codex@$(CODEX_VERSION) >/dev/null; }

lint: deps fmt-check vet staticcheck buf-lint buf-breaking proto-check sdk-gen-check tidy-check deploy-check tracked-check

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.tools/*')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck: $(TOOLS)/staticcheck
	$(TOOLS)/staticcheck ./...

buf-lint: $(TOOLS)/buf
	$(TOOLS)/buf lint

## buf-breaking: the API against its newest baseline (docs/api.md): nothing a client built
## against it relies on may change.
API_BASELINE := $(lastword $(sort $(wildcard api/baseline/v*.binpb)))
buf-breaking: $(TOOLS)/buf
	$(TOOLS)/buf breaking --against $(API_BASELINE)

## api-baseline: cut a new baseline at a minor version (docs/api.md): make api-baseline VERSION=v0.2.0
api-baseline: $(TOOLS)/buf
	@test -n "$(filter v%,$(VERSION))" || { echo "give VERSION=vX.Y.0"; exit 1; }
	$(TOOLS)/buf build -o api/baseline/$(VERSION).binpb

## tidy-check: go.mod and go.sum say exactly what the code imports.
tidy-check:
	$(GO) mod tidy -diff

## tracked-check: no tracked file outside a testdata/ directory is an ELF binary or larger
## than 1 MiB: build outputs stay out of git.
tracked-check:
	./scripts/tracked-check.sh

## deploy-check: the Grafana dashboard and Prometheus rules in deploy/ (promtool from apt when missing).
deploy-check:
	./deploy/check.sh

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

## bench: the benchmarks whose numbers docs/performance.md quotes.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./pkg/manifest/ ./pkg/session/ ./pkg/server/ ./pkg/spawn/ ./pkg/ledger/ ./pkg/workdir/ ./pkg/containment/idsweep/ ./pkg/containment/sysview/ ./pkg/fleet/etcdstore/

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
	$(GO) test -run '^$$' -fuzz FuzzReadMessage -fuzztime 20s -fuzzminimizetime 5s ./pkg/containment/sealer/
	$(GO) test -run '^$$' -fuzz FuzzParseSysvipc -fuzztime 20s -fuzzminimizetime 5s ./pkg/containment/idsweep/
	$(GO) test -run '^$$' -fuzz FuzzParseStatus -fuzztime 20s -fuzzminimizetime 5s ./pkg/containment/idsweep/
	$(GO) test -run '^$$' -fuzz FuzzParseClaim -fuzztime 20s -fuzzminimizetime 5s ./pkg/containment/idsweep/
	$(GO) test -run '^$$' -fuzz FuzzOpenTreeResolvesAsTheKernel -fuzztime 20s -fuzzminimizetime 5s ./pkg/artifact/
	$(GO) test -run '^$$' -fuzz FuzzLdCache -fuzztime 20s -fuzzminimizetime 5s ./pkg/containment/sysview/
	$(GO) test -run '^$$' -fuzz FuzzDynamic -fuzztime 20s -fuzzminimizetime 5s ./pkg/containment/sysview/
	$(GO) test -run '^$$' -fuzz FuzzCheckLabels -fuzztime 20s -fuzzminimizetime 5s ./pkg/session/store/

tools: $(TOOLS)/buf $(TOOLS)/staticcheck $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc $(TOOLS)/grpcurl

# buf, staticcheck and grpcurl (the e2e tests call roostd's health and reflection services
# with it; Debian bookworm has no package of it) are pinned in tools/go.mod (buf needs a
# newer protobuf than roost's); the protoc plugins are pinned by roost's own go.mod,
# matching the runtime they generate for.
$(TOOLS)/buf $(TOOLS)/staticcheck: tools/go.mod tools/go.sum
	cd tools && GOBIN=$(TOOLS) $(GO) install github.com/bufbuild/buf/cmd/buf honnef.co/go/tools/cmd/staticcheck

$(TOOLS)/grpcurl: tools/go.mod tools/go.sum
	cd tools && GOBIN=$(TOOLS) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl

$(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc: go.mod go.sum
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

## install: roostd, roostctl, roost-init, roost-sealer and roost-wasm (from $(INSTALL_FROM): make build first) to
## $(DESTDIR)$(PREFIX)/bin, mode 0755; the systemd unit to $(DESTDIR)/lib/systemd/system with
## its paths under $(PREFIX); a default configuration (all comments) to
## $(DESTDIR)/etc/roost/roostd.yaml unless one is there; README.md to
## $(DESTDIR)$(PREFIX)/share/doc/roost, and docs/*.md to its docs/ (so the pages' links hold);
## roostctl's man pages to $(PREFIX)/share/man/man1 and its bash completion to
## $(PREFIX)/share/bash-completion/completions; roostd.8 and capsule.yaml.5 (man/) to
## $(PREFIX)/share/man/man8 and man5.
install:
	@for b in $(INSTALL_BINS); do [ -f "$(INSTALL_FROM)/$$b" ] && [ -x "$(INSTALL_FROM)/$$b" ] || \
		{ echo "install: $(INSTALL_FROM)/$$b is missing: run make build first (roost-wasm needs cgo: gcc)" >&2; exit 1; }; done
	@ls $(INSTALL_FROM)/man/*.1 >/dev/null 2>&1 || \
		{ echo "install: $(INSTALL_FROM)/man holds no man pages: run make build first" >&2; exit 1; }
	install -d -m 0755 "$(DESTDIR)$(PREFIX)/bin" "$(DESTDIR)$(UNITDIR)" "$(DESTDIR)$(DOCDIR)/docs"
	install -m 0755 $(addprefix $(INSTALL_FROM)/,$(INSTALL_BINS)) "$(DESTDIR)$(PREFIX)/bin/"
	sed -e 's|/usr/local/bin/|$(PREFIX)/bin/|g' -e 's|/usr/local/share/doc/roost/|$(DOCDIR)/|g' \
		deploy/systemd/roostd.service >"$(DESTDIR)$(UNITDIR)/.roostd.service.tmp"
	chmod 0644 "$(DESTDIR)$(UNITDIR)/.roostd.service.tmp"
	mv -f "$(DESTDIR)$(UNITDIR)/.roostd.service.tmp" "$(DESTDIR)$(UNITDIR)/roostd.service"
	@# An operator's configuration is never replaced (nor its directory's mode changed).
	@if [ -e "$(DESTDIR)$(CONFDIR)/roostd.yaml" ]; then \
		echo "keeping $(DESTDIR)$(CONFDIR)/roostd.yaml"; \
	else \
		[ -d "$(DESTDIR)$(CONFDIR)" ] || install -d -m 0755 "$(DESTDIR)$(CONFDIR)"; \
		echo "sed ... deploy/systemd/roostd.yaml >$(DESTDIR)$(CONFDIR)/roostd.yaml"; \
		sed -e 's|/usr/local/share/doc/roost/|$(DOCDIR)/|g' deploy/systemd/roostd.yaml >"$(DESTDIR)$(CONFDIR)/.roostd.yaml.tmp" && \
		chmod 0644 "$(DESTDIR)$(CONFDIR)/.roostd.yaml.tmp" && \
		mv -n "$(DESTDIR)$(CONFDIR)/.roostd.yaml.tmp" "$(DESTDIR)$(CONFDIR)/roostd.yaml"; \
		rm -f "$(DESTDIR)$(CONFDIR)/.roostd.yaml.tmp"; \
	fi
	install -m 0644 README.md "$(DESTDIR)$(DOCDIR)/"
	install -m 0644 docs/*.md "$(DESTDIR)$(DOCDIR)/docs/"
	install -d -m 0755 "$(DESTDIR)$(PREFIX)/share/man/man1" "$(DESTDIR)$(PREFIX)/share/bash-completion/completions"
	install -m 0644 $(INSTALL_FROM)/man/*.1 "$(DESTDIR)$(PREFIX)/share/man/man1/"
	install -d -m 0755 "$(DESTDIR)$(PREFIX)/share/man/man5" "$(DESTDIR)$(PREFIX)/share/man/man8"
	install -m 0644 man/capsule.yaml.5 "$(DESTDIR)$(PREFIX)/share/man/man5/"
	install -m 0644 man/roostd.8 "$(DESTDIR)$(PREFIX)/share/man/man8/"
	$(INSTALL_FROM)/roostctl completion bash >"$(DESTDIR)$(PREFIX)/share/bash-completion/completions/roostctl"
	@[ -n "$(DESTDIR)" ] || echo "installed; now: systemctl daemon-reload && systemctl enable --now roostd"

## install-check: make install into a temporary DESTDIR, with the default PREFIX and another:
## the layout, the modes, ExecStart under PREFIX, a second install keeping an edited
## configuration, man -l rendering the installed roostd.8 and capsule.yaml.5 without a warning,
## and systemd-analyze verify of the unit as installed (--root: the host's own
## units stand in for the target's sysinit.target and the like). With INSTALL_FROM set to other
## binaries (the e2e tests' own) it builds nothing.
install-check: $(if $(filter bin,$(INSTALL_FROM)),build)
	@command -v systemd-analyze >/dev/null || { echo "install-check: systemd-analyze is missing (apt-get install systemd)" >&2; exit 1; }
	@command -v man >/dev/null || { echo "install-check: man is missing (apt-get install man-db)" >&2; exit 1; }
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; set -e; \
	for prefix in /usr/local /opt/roost; do \
		root="$$tmp/root$$(echo $$prefix | tr / -)"; \
		$(MAKE) --no-print-directory -s install DESTDIR="$$root" PREFIX="$$prefix" INSTALL_FROM="$(INSTALL_FROM)" >/dev/null; \
		for b in $(INSTALL_BINS); do \
			mode=$$(stat -c %a "$$root$$prefix/bin/$$b"); \
			[ "$$mode" = 755 ] || { echo "install-check: $$prefix/bin/$$b has mode $$mode, want 755" >&2; exit 1; }; \
		done; \
		unit="$$root$(UNITDIR)/roostd.service"; \
		grep -q "^ExecStart=$$prefix/bin/roostd " "$$unit" || { echo "install-check: $$unit: ExecStart is not under $$prefix:" >&2; grep ExecStart "$$unit" >&2; exit 1; }; \
		for p in README.md docs/*.md; do [ -f "$$root$$prefix/share/doc/roost/$$p" ] || \
			{ echo "install-check: $$p is not installed in $$root$$prefix/share/doc/roost" >&2; exit 1; }; done; \
		[ -f "$$root$(CONFDIR)/roostd.yaml" ] && \
			[ -f "$$root$$prefix/share/man/man1/roostctl-run.1" ] && [ -s "$$root$$prefix/share/bash-completion/completions/roostctl" ] || \
			{ echo "install-check: the configuration or the docs are missing under $$root" >&2; exit 1; }; \
		for page in man8/roostd.8 man5/capsule.yaml.5; do \
			page="$$root$$prefix/share/man/$$page"; mode=$$(stat -c %a "$$page" 2>/dev/null) || mode=missing; \
			[ "$$mode" = 644 ] || { echo "install-check: $$page: mode $$mode, want 644" >&2; exit 1; }; \
			out=$$(MANPAGER=cat man --warnings -l "$$page" 2>&1 >/dev/null) && [ -z "$$out" ] || \
				{ echo "$$out" >&2; echo "install-check: man -l $$page warned or failed" >&2; exit 1; }; \
		done; \
		echo "# the operator's own" >>"$$root$(CONFDIR)/roostd.yaml"; \
		$(MAKE) --no-print-directory -s install DESTDIR="$$root" PREFIX="$$prefix" INSTALL_FROM="$(INSTALL_FROM)" >/dev/null; \
		grep -q "^# the operator's own" "$$root$(CONFDIR)/roostd.yaml" || { echo "install-check: a second make install overwrote $(CONFDIR)/roostd.yaml" >&2; exit 1; }; \
		cp -an /lib/systemd/system/. "$$root$(UNITDIR)/"; \
		out=$$(systemd-analyze verify --root="$$root" --man=no --generators=no "$$unit" 2>&1) || { echo "$$out" >&2; echo "install-check: systemd-analyze verify failed" >&2; exit 1; }; \
		[ -z "$$out" ] || { echo "$$out" >&2; echo "install-check: systemd-analyze verify warned" >&2; exit 1; }; \
		echo "install-check: PREFIX=$$prefix: installed layout, modes, ExecStart, man pages, kept configuration, systemd-analyze verify: ok"; \
	done

clean:
	rm -rf bin .tools
