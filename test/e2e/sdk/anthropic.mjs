// The official Anthropic SDK, configured by nothing but the environment roost sets for
// inference.upstream (ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY), against roost's gateway:
// messages plain, streamed and through the stream helper, count_tokens (which roost never
// charges), then the refusals: a model the capsule may not use (403) and a call past the
// session's ceiling (429), each surfaced at once, not retried. Run by TestOfficialSDKs.

import Anthropic from '@anthropic-ai/sdk';
import { ceilingDetail, counting, env, finish, metered, refused, spend, versions } from './lib.mjs';

const MODEL = env('SDK_MODEL');
const OTHER = env('SDK_OTHER_MODEL');
const REPLY = env('SDK_REPLY');
const IN = Number(env('SDK_INPUT_TOKENS'));
const OUT = Number(env('SDK_OUTPUT_TOKENS'));
const MAX = 64;

console.log(`versions: ${versions('@anthropic-ai/sdk')}`);
const client = new Anthropic();
const messages = [{ role: 'user', content: 'Say hello.' }];

const text = (msg) => (msg?.content ?? []).filter((b) => b.type === 'text').map((b) => b.text).join('');

await metered('messages', IN + OUT, async (p) => {
  const m = await client.messages.create({ model: MODEL, max_tokens: MAX, messages });
  p.eq('text', text(m), REPLY);
  p.eq('model', m.model, MODEL);
  p.eq('stop_reason', m.stop_reason, 'end_turn');
  p.eq('usage', [m.usage?.input_tokens, m.usage?.output_tokens], [IN, OUT]);
});

await metered('messages-stream', IN + OUT, async (p) => {
  const stream = await client.messages.create({ model: MODEL, max_tokens: MAX, messages, stream: true });
  let streamed = '';
  const types = [];
  let input;
  let output;
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === 'message_start') {
      input = event.message.usage.input_tokens;
    } else if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') {
      streamed += event.delta.text;
    } else if (event.type === 'message_delta') {
      output = event.usage.output_tokens;
    }
  }
  p.eq('streamed text', streamed, REPLY);
  p.eq('first and last events', [types[0], types.at(-1)], ['message_start', 'message_stop']);
  p.eq('usage (message_start, message_delta)', [input, output], [IN, OUT]);
});

await metered('messages-stream-helper', IN + OUT, async (p) => {
  const stream = client.messages.stream({ model: MODEL, max_tokens: MAX, messages });
  let deltas = '';
  stream.on('text', (delta) => {
    deltas += delta;
  });
  const final = await stream.finalMessage();
  p.eq('final text', text(final), REPLY);
  p.eq('text deltas', deltas, REPLY);
  p.eq('usage', [final.usage?.input_tokens, final.usage?.output_tokens], [IN, OUT]);
});

await metered('count-tokens', 0, async (p) => {
  const r = await client.messages.countTokens({ model: MODEL, messages });
  p.ok(Number.isInteger(r?.input_tokens) && r.input_tokens > 0, `input_tokens is ${JSON.stringify(r?.input_tokens)} (${JSON.stringify(r)})`);
  p.note(`counted ${JSON.stringify(r)}`);
});

// Anthropic's envelope: {"type": "error", "error": {"type", "message"}}; the SDK holds the
// whole body. roost's field may sit beside "error" or in it.
function envelope(err, p) {
  const body = err.error;
  if (!p.ok(body !== null && typeof body === 'object', `the body is ${JSON.stringify(body)}, not Anthropic's error envelope`)) {
    return undefined;
  }
  p.eq('type', body.type, 'error');
  const e = body.error;
  if (!p.ok(e !== null && typeof e === 'object', `the body's "error" is ${JSON.stringify(e)}, not {"type","message"}`)) {
    return body;
  }
  p.ok(typeof e.type === 'string' && e.type !== '', `error.type is ${JSON.stringify(e.type)}`);
  p.ok(typeof e.message === 'string' && e.message !== '', `error.message is ${JSON.stringify(e.message)}`);
  return body.roost !== undefined ? body : e;
}

// The Anthropic SDK's message is the whole body as JSON; roost's detail must be in the
// envelope's own message (the SDK's apiMessage), which is what a program shows.
const apiMessage = (err) => err.apiMessage ?? err.error?.error?.message ?? '';

await metered('forbidden-model', 0, async (p) => {
  const counter = counting();
  const c = new Anthropic({ fetch: counter.fetch });
  const got = await refused(p, {
    APIError: Anthropic.APIError,
    status: 403,
    counter,
    call: () => c.messages.create({ model: OTHER, max_tokens: MAX, messages }),
    texts: ['inference.model', MODEL, OTHER],
    envelope,
    roostSeen: true,
  });
  if (got) {
    for (const t of ['inference.model', MODEL, OTHER]) {
      p.ok(apiMessage(got.err).includes(t), `error.message lacks roost's ${JSON.stringify(t)}: ${JSON.stringify(apiMessage(got.err))}`);
    }
  }
});

// Last: a session's ceiling refusal latches, and every call after it is refused too.
await metered('ceiling', 0, async (p) => {
  const before = await spend();
  const asked = before.ceiling * 2;
  if (!p.ok(before.ceiling > 0, `the session has no ceiling (${JSON.stringify(before)})`)) {
    return;
  }
  const counter = counting();
  const c = new Anthropic({ fetch: counter.fetch });
  const got = await refused(p, {
    APIError: Anthropic.APIError,
    status: 429,
    counter,
    // Thinking: at least 1,025 output tokens, more than the whole ceiling, so the call is
    // refused rather than lowered to fit.
    call: () => c.messages.create({ model: MODEL, max_tokens: asked, thinking: { type: 'enabled', budget_tokens: 1024 }, messages }),
    texts: [],
    envelope,
    roostSeen: true,
  });
  if (got) {
    ceilingDetail(p, apiMessage(got.err), got.roost, { ceiling: before.ceiling, used: before.charged, asked: 1025 });
  }
});

finish();
