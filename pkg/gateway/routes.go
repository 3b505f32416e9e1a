package gateway

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"roost.dev/roost/pkg/config"
)

// kind is what the gateway knows of a route's calls: how their worst case is read from the
// body, and whether they are metered at all.
type kind int

const (
	// kindChat is OpenAI's chat/completions: output max_completion_tokens or max_tokens,
	// times n.
	kindChat kind = iota + 1
	// kindCompletions is OpenAI's legacy completions: max_tokens times the larger of n and
	// best_of, times the prompts in a list of prompts.
	kindCompletions
	// kindResponses is OpenAI's responses: max_output_tokens, no multiplier.
	kindResponses
	// kindEmbeddings is OpenAI's embeddings: input only.
	kindEmbeddings
	// kindMessages is Anthropic's messages: max_tokens, no multiplier.
	kindMessages
	// kindCountTokens is Anthropic's messages/count_tokens: a JSON body held to the declared
	// model, never charged.
	kindCountTokens
	// kindModels lists or describes models: no body, never charged.
	kindModels
	// kindDeclared is a route the operator declared (inference.upstreams[].routes).
	kindDeclared
)

// wildcard stands for any one segment in a route's path.
const wildcard = "{}"

// route is one method and path the gateway forwards to an upstream.
type route struct {
	method string
	segs   []string
	kind   kind
	// query names the query parameters forwarded.
	query []string
	// metered routes are admitted and settled; tokens is a declared metered route's
	// admission.
	metered bool
	tokens  int64
}

func (rt *route) String() string { return rt.method + " " + strings.Join(rt.segs, "/") }

// jsonBody reports whether the route's body is a JSON object the gateway reads (the cost,
// the model): every built-in route that takes a body.
func (rt *route) jsonBody() bool { return rt.kind != kindModels && rt.kind != kindDeclared }

func builtin(method, path string, k kind, query ...string) route {
	return route{method: method, segs: strings.Split(path, "/"), kind: k, query: query,
		metered: k != kindCountTokens && k != kindModels}
}

// builtinRoutes are what each format's upstream is called for without configuration, paths
// relative to the upstream's url as the client names them under /v1/inference/<upstream>/.
// The SDKs' own query parameters are forwarded: Anthropic's beta=true (older SDKs mark
// beta calls so) and its models list's paging.
var builtinRoutes = map[string][]route{
	config.FormatOpenAI: {
		builtin("POST", "v1/chat/completions", kindChat),
		builtin("POST", "v1/responses", kindResponses),
		builtin("POST", "v1/completions", kindCompletions),
		builtin("POST", "v1/embeddings", kindEmbeddings),
		builtin("GET", "v1/models", kindModels),
		builtin("GET", "v1/models/"+wildcard, kindModels),
	},
	config.FormatAnthropic: {
		builtin("POST", "v1/messages", kindMessages, "beta"),
		builtin("POST", "v1/messages/count_tokens", kindCountTokens, "beta"),
		builtin("GET", "v1/models", kindModels, "beta", "limit", "after_id", "before_id"),
		builtin("GET", "v1/models/"+wildcard, kindModels, "beta"),
	},
}

// routesOf is the table an upstream is called through: its format's built-in routes, then
// those its configuration declares.
func routesOf(u config.Upstream) []route {
	routes := slices.Clone(builtinRoutes[u.Format])
	for _, d := range u.Routes {
		segs := strings.Split(strings.TrimPrefix(d.Path, "/"), "/")
		for i, s := range segs {
			if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
				segs[i] = wildcard
			}
		}
		metered := d.Metered != nil && *d.Metered
		routes = append(routes, route{method: d.Method, segs: segs, kind: kindDeclared, query: d.Query, metered: metered, tokens: d.Tokens})
	}
	return routes
}

// match finds the route of a call and the path it is sent upstream as, escaped, built from
// the route's own segments and the wildcard segments' values alone. path is the call's path
// under the upstream as the server decoded it; u is its URL as it came.
func match(routes []route, method string, u *url.URL, path string) (*route, string, url.Values, error) {
	segs, err := cleanPath(u.EscapedPath(), path)
	if err != nil {
		return nil, "", nil, err
	}
	var found *route
	for i := range routes {
		rt := &routes[i]
		if rt.method == method && segsMatch(rt.segs, segs) {
			found = rt
			break
		}
	}
	if found == nil {
		var offered []string
		for i := range routes {
			offered = append(offered, routes[i].String())
		}
		return nil, "", nil, &apiError{status: 403, code: "route_not_allowed",
			msg: fmt.Sprintf("roost's inference gateway does not forward %s %s to this upstream; it forwards %s (roostd's --config may add routes: inference.upstreams[].routes)", method, path, strings.Join(offered, ", "))}
	}
	query, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, "", nil, &apiError{status: 400, code: "invalid_query", msg: fmt.Sprintf("the query %q does not parse: %v", u.RawQuery, err)}
	}
	for name := range query {
		if !slices.Contains(found.query, name) {
			return nil, "", nil, &apiError{status: 400, code: "invalid_query", msg: fmt.Sprintf("query parameter %q is not forwarded on %s (forwarded: %s)", name, found, strings.Join(found.query, ", "))}
		}
	}
	out := make([]string, len(segs))
	for i, s := range found.segs {
		if s == wildcard {
			out[i] = url.PathEscape(segs[i])
		} else {
			out[i] = s
		}
	}
	return found, strings.Join(out, "/"), query, nil
}

func segsMatch(route, segs []string) bool {
	if len(route) != len(segs) {
		return false
	}
	for i, s := range route {
		if s != wildcard && s != segs[i] {
			return false
		}
	}
	return true
}

// cleanPath refuses a path that could mean something other than what it says to the
// upstream or to a proxy before it — dot segments, empty segments, backslashes, percent-
// encoded slashes, backslashes, dots or percent signs (so nothing double-encoded), control
// characters — and returns its segments. raw is the request's whole escaped path, path the
// part under the upstream as decoded; both are checked, since a server decodes %2f into a
// slash the decoded path no longer shows.
func cleanPath(raw, path string) ([]string, error) {
	bad := func(why string) error {
		return &apiError{status: 400, code: "invalid_path", msg: fmt.Sprintf("the path %q is refused: %s", raw, why)}
	}
	if strings.Contains(raw, `\`) {
		return nil, bad("it holds a backslash")
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '%' {
			continue
		}
		if i+2 >= len(raw) || !ishex(raw[i+1]) || !ishex(raw[i+2]) {
			return nil, bad("a malformed percent-encoding")
		}
		switch c := unhex(raw[i+1])<<4 | unhex(raw[i+2]); {
		case c == '/' || c == '\\':
			return nil, bad("an encoded slash or backslash")
		case c == '%':
			return nil, bad("an encoded percent sign (double encoding)")
		case c == '.':
			return nil, bad("an encoded dot")
		case c < 0x20 || c == 0x7f:
			return nil, bad("an encoded control character")
		}
	}
	if path == "" {
		return nil, bad("no route named")
	}
	segs := strings.Split(path, "/")
	for _, s := range segs {
		switch {
		case s == "":
			return nil, bad("an empty segment (// or a trailing slash)")
		case s == "." || s == "..":
			return nil, bad("a dot segment")
		case strings.ContainsAny(s, `\%`):
			return nil, bad("a backslash or percent sign in a segment")
		case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
			return nil, bad("a control character")
		}
	}
	return segs, nil
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}
