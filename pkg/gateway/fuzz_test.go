package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/url"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"

	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/ledger"
)

// FuzzUsage feeds the meter whatever an upstream might answer, as JSON and as an event
// stream: it never panics, reports only usage the ledger accepts, reads the same whether the
// answer arrives whole, cut in two anywhere or a byte at a time, and the body the proxy
// copies passes through it unchanged.
func FuzzUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":12,"completion_tokens":30}}`), uint16(7))
	f.Add([]byte(`{"type":"message_start","message":{"usage":{"input_tokens":7,"cache_read_input_tokens":3}}}`), uint16(0))
	f.Add([]byte("event: response.completed\ndata: {\"response\":{\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}\n\n"), uint16(40))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":-5,\"completion_tokens\":99999999999999999}}\n\ndata: [DONE]\n"), uint16(3))
	f.Add([]byte(": c\r\ndata: {\"choices\":[],\r\ndata: \"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\r\n\r\ndata: [DONE]\r\r"), uint16(17))
	f.Add([]byte("data: {\"usage\":{\"input_tokens\":9223372036854775807,\"cache_read_input_tokens\":9223372036854775807}}\n\n"), uint16(9))
	f.Add([]byte(`{"us\u0061ge":{"prompt_tokens":2},"Usage":{"completion_tokens":3},"choices":[{"message":{"usage":{"prompt_tokens":99}}}]}`), uint16(11))
	f.Add([]byte(`{"message":{"usage":{"input_tokens":4}},"message":{"usage":null},"response":{"x":{"usage":{"input_tokens":9}},"usage":{"output_tokens":1}}}`), uint16(30))
	f.Add([]byte("data: {\"type\":\"message_delta\",\n\ndata: \"usage\":{\"output_tokens\":5}}\n\ndata:{\"choices\" : [ ] , \"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\r\n\r\n"), uint16(5))
	f.Add([]byte(`{"choices":"[]","usage":{"prompt_tokens":"1"}} `), uint16(2))
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		for _, sse := range []bool{false, true} {
			whole := &meter{sse: sse}
			whole.Write(data)
			whole.end()
			u, final := whole.usage()
			check(t, u)

			// Wherever the meter that kept the answer and decoded it with encoding/json
			// could decode it, the scan reads the same.
			ref := &refMeter{sse: sse}
			ref.Write(data)
			ref.end()
			if ru, rf := ref.usage(); !ref.failed && (rf != final || (ru == nil) != (u == nil) || (u != nil && *ru != *u)) {
				t.Fatalf("sse %v: scanned %+v %v, decoded whole %+v %v", sse, u, final, ru, rf)
			}

			at := int(cut) % (len(data) + 1)
			split := &meter{sse: sse}
			split.Write(data[:at])
			split.Write(data[at:])
			split.end()
			bytewise := &meter{sse: sse}
			for i := range data {
				bytewise.Write(data[i : i+1])
			}
			bytewise.end()
			for _, other := range []*meter{split, bytewise} {
				if ou, of := other.usage(); of != final || (ou == nil) != (u == nil) || (u != nil && *ou != *u) {
					t.Fatalf("sse %v: read whole %+v %v, in pieces %+v %v", sse, u, final, ou, of)
				}
			}

			through := &meter{sse: sse}
			got, err := io.ReadAll(&meteredBody{ReadCloser: io.NopCloser(bytes.NewReader(data)), meter: through})
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("the answer came through changed")
			}
			if tu, tf := through.usage(); tf != final || (tu == nil) != (u == nil) || (u != nil && *tu != *u) {
				t.Fatalf("read through the body: %+v %v, want %+v %v", tu, tf, u, final)
			}
		}
	})
}

func check(t *testing.T, u *ledger.Usage) {
	if u != nil && (u.Input < 0 || u.Output < 0 || u.Input > ledger.MaxTokens || u.Output > ledger.MaxTokens) {
		t.Fatalf("usage %+v", *u)
	}
}

// jsonRoutes are the built-in routes whose body the gateway reads.
func jsonRoutes() []route {
	var out []route
	for _, format := range []string{config.FormatOpenAI, config.FormatAnthropic} {
		for _, rt := range builtinRoutes[format] {
			if rt.jsonBody() {
				out = append(out, rt)
			}
		}
	}
	return out
}

// FuzzPrepare feeds a call's preparation any request body on any built-in route: it never
// panics, refuses only with a 400 or 403 of its own, and what it admits is positive and
// bounded; the body it forwards is a JSON object naming the declared model, and preparing
// that again changes nothing — the upstream reads what the gateway read.
func FuzzPrepare(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[],"max_tokens":50,"stream":true}`), uint8(0))
	f.Add([]byte(`{"max_completion_tokens":-1}`), uint8(0))
	f.Add([]byte(`[1,2]`), uint8(1))
	f.Add([]byte(`{"model":"m","prompt":["a","b"],"n":3,"best_of":5,"max_tokens":1e300}`), uint8(2))
	f.Add([]byte(`{"n":50,"n":1,"max_tokens":400.5,"stream":true,"stream_options":{"include_usage":false}}`), uint8(0))
	f.Add([]byte(`{"model":"m","input":"<b>&</b>","max_output_tokens":"9"}`), uint8(1))
	f.Add([]byte(`{"stream":true,"stream_options":null}`), uint8(0))
	f.Add([]byte(` { "mod\u0065l" : "x" , "model":null, "stream" : true , "stream_options" : { "include_usage" : false , "x" : [1,{"a":"}"}] } } `), uint8(2))
	f.Add([]byte(`{"prompt":[[1,2],[3]],"stream":true,"stream_options":{"include_usage":true,"include_usage":true},"n":2}`), uint8(2))
	f.Add([]byte(`{"\ud800":1,"\udbff":2,"messages":[{"role":"user","content":"\"}"}]}`), uint8(0))
	f.Fuzz(func(t *testing.T, body []byte, which uint8) {
		routes := jsonRoutes()
		rt := &routes[int(which)%len(routes)]
		c := call{route: rt, body: body}
		err := c.prepare(Caller{Model: "m"}, 4096)
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) || (ae.status != 400 && ae.status != 403) {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		if c.input <= 0 || c.output < 0 || c.reservation() <= 0 || c.reservation() > ledger.MaxTokens {
			t.Fatalf("admits %d + %d", c.input, c.output)
		}
		if rt.metered && rt.kind != kindEmbeddings && c.output <= 0 {
			t.Fatalf("a model call admitted for no output: %s", body)
		}
		var sent struct {
			Model string `json:"model"`
		}
		out := c.out().join()
		if int64(len(out)) != c.out().size() || json.Unmarshal(out, &sent) != nil || sent.Model != "m" {
			t.Fatalf("forwards %s", out)
		}
		again := call{route: rt, body: out}
		if err := again.prepare(Caller{Model: "m"}, 4096); err != nil || !bytes.Equal(again.out().join(), out) || again.input != c.input || again.output != c.output {
			t.Fatalf("prepared twice: %v\n%s\n%s", err, out, again.out().join())
		}
		sameMembers(t, rt, body, out)
	})
}

// FuzzRoute feeds the route matcher any method and request-target: it never panics, and a
// call it lets through goes to a route of the table, by its method, at a path made of the
// route's segments and wildcard values that are each one plain segment — never a dot
// segment, an empty one, a backslash or anything percent-encoded that was not a character
// of its own — with only the route's query parameters.
func FuzzRoute(f *testing.F) {
	for _, s := range []struct{ method, target string }{
		{"POST", "v1/chat/completions"}, {"GET", "v1/models/gpt-4o"}, {"GET", "v1/models/ft:gpt-4o:org:x?x=1"},
		{"POST", "v1/%2e%2e/%2e%2e/admin/secrets"}, {"POST", "v1/chat%2fcompletions"}, {"POST", "v1/chat%252fcompletions"},
		{"GET", "v1/files/a%20b/content"}, {"POST", `v1\chat`}, {"GET", "v1/models/..%2f"}, {"DELETE", "v1/files/x"},
		{"GET", "v1/models?limit=3&after_id=x"},
	} {
		f.Add(s.method, s.target)
	}
	unmetered := false
	u := config.Upstream{Format: config.FormatAnthropic, Routes: []config.Route{
		{Method: "GET", Path: "v1/files/{id}/content", Metered: &unmetered, Query: []string{"limit"}},
	}}
	routes := slices.Concat(builtinRoutes[config.FormatOpenAI], routesOf(u))
	f.Fuzz(func(t *testing.T, method, target string) {
		const prefix = "/v1/inference/up/"
		in, err := url.ParseRequestURI(prefix + target)
		if err != nil || !strings.HasPrefix(in.Path, prefix) {
			return
		}
		rt, sent, query, err := match(routes, method, in, strings.TrimPrefix(in.Path, prefix))
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) || (ae.status != 400 && ae.status != 403) {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		if rt.method != method {
			t.Fatalf("%s matched %s", method, rt)
		}
		segs := strings.Split(sent, "/")
		if len(segs) != len(rt.segs) {
			t.Fatalf("%q sent as %q for %s", target, sent, rt)
		}
		for i, s := range segs {
			plain, err := url.PathUnescape(s)
			switch {
			case rt.segs[i] != wildcard && s != rt.segs[i]:
				t.Fatalf("%q sent as %q for %s", target, sent, rt)
			case err != nil || plain == "" || plain == "." || plain == ".." || strings.ContainsAny(plain, `/\%`) || url.PathEscape(plain) != s:
				t.Fatalf("%q: segment %q sent as %q", target, plain, s)
			}
		}
		if path.Clean("/"+sent) != "/"+sent || strings.Contains(strings.ToLower(sent), "%2e") {
			t.Fatalf("%q sent as %q", target, sent)
		}
		for name := range query {
			if !slices.Contains(rt.query, name) {
				t.Fatalf("%q: query %q forwarded on %s", target, name, rt)
			}
		}
	})
}

// sameMembers: out, the body forwarded for in, is one JSON object holding each name once,
// and decodes to the members encoding/json reads of in (a name given twice is its last)
// with the gateway's rewrite applied: the declared model filled in where none is named, a
// streamed chat or completions call's stream_options saying include_usage.
func sameMembers(t *testing.T, rt *route, in, out []byte) {
	t.Helper()
	var want, got map[string]json.RawMessage
	if err := json.Unmarshal(in, &want); err != nil {
		t.Fatalf("prepared a body encoding/json refuses: %v", err)
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("forwards %s: %v", out, err)
	}
	// A model named "" is none: the declared one is filled in.
	var model string
	if json.Unmarshal(want["model"], &model) != nil || model == "" {
		want["model"] = json.RawMessage(`"m"`)
	}
	var stream bool
	_ = json.Unmarshal(want["stream"], &stream)
	if stream && (rt.kind == kindChat || rt.kind == kindCompletions) {
		opts := map[string]json.RawMessage{}
		_ = json.Unmarshal(want["stream_options"], &opts)
		opts["include_usage"] = json.RawMessage("true")
		want["stream_options"], _ = json.Marshal(opts)
		onceEach(t, got["stream_options"])
	}
	onceEach(t, out)
	if len(got) != len(want) {
		t.Fatalf("forwards %d members of %d: %s for %s", len(got), len(want), out, in)
	}
	for name, w := range want {
		var wv, gv any
		_ = json.Unmarshal(w, &wv)
		if err := json.Unmarshal(got[name], &gv); err != nil || !reflect.DeepEqual(wv, gv) {
			t.Fatalf("member %q forwarded as %s, read as %s", name, got[name], w)
		}
	}
}

// onceEach: the JSON object raw names each member once.
func onceEach(t *testing.T, raw []byte) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %s", raw)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, _ := dec.Token()
		name, _ := tok.(string)
		if seen[name] {
			t.Fatalf("%q given twice in %s", name, raw)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
}
