// The official OpenAI SDK, configured by nothing but the environment roost sets for
// inference.upstream (OPENAI_BASE_URL, OPENAI_API_KEY), against roost's gateway: chat
// completions plain, streamed and through the stream helper, responses plain, streamed and
// through theirs, then the refusals: a model the capsule may not use (403) and a call past
// the session's ceiling (429), each surfaced at once, not retried. Run by TestOfficialSDKs.

import OpenAI from 'openai';
import { ceilingDetail, counting, env, finish, metered, refused, spend, versions } from './lib.mjs';

const MODEL = env('SDK_MODEL');
const OTHER = env('SDK_OTHER_MODEL');
const REPLY = env('SDK_REPLY');
const IN = Number(env('SDK_INPUT_TOKENS'));
const OUT = Number(env('SDK_OUTPUT_TOKENS'));
// Each call's output limit: above the fake's usage, so the fake reports it whole.
const MAX = 64;

console.log(`versions: ${versions('openai')}`);
const client = new OpenAI();
const messages = [{ role: 'user', content: 'Say hello.' }];

await metered('chat', IN + OUT, async (p) => {
  const c = await client.chat.completions.create({ model: MODEL, messages, max_completion_tokens: MAX });
  p.eq('text', c.choices?.[0]?.message?.content, REPLY);
  p.eq('model', c.model, MODEL);
  p.eq('usage', [c.usage?.prompt_tokens, c.usage?.completion_tokens], [IN, OUT]);
});

await metered('chat-stream', IN + OUT, async (p) => {
  const stream = await client.chat.completions.create({ model: MODEL, messages, max_completion_tokens: MAX, stream: true });
  let text = '';
  let chunks = 0;
  let finish;
  for await (const chunk of stream) {
    chunks++;
    text += chunk.choices?.[0]?.delta?.content ?? '';
    finish = chunk.choices?.[0]?.finish_reason ?? finish;
  }
  p.eq('streamed text', text, REPLY);
  p.ok(chunks > 2, `${chunks} chunks: the answer did not stream`);
  p.eq('finish_reason', finish, 'stop');
});

await metered('chat-stream-helper', IN + OUT, async (p) => {
  const stream = client.chat.completions.stream({ model: MODEL, messages, max_completion_tokens: MAX });
  let deltas = '';
  stream.on('content', (delta) => {
    deltas += delta;
  });
  const final = await stream.finalChatCompletion();
  p.eq('final text', final.choices?.[0]?.message?.content, REPLY);
  p.eq('content deltas', deltas, REPLY);
});

await metered('responses', IN + OUT, async (p) => {
  const r = await client.responses.create({ model: MODEL, input: 'Say hello.', max_output_tokens: MAX });
  p.eq('output_text', r.output_text, REPLY);
  p.eq('status', r.status, 'completed');
  p.eq('usage', [r.usage?.input_tokens, r.usage?.output_tokens], [IN, OUT]);
});

await metered('responses-stream', IN + OUT, async (p) => {
  const stream = await client.responses.create({ model: MODEL, input: 'Say hello.', max_output_tokens: MAX, stream: true });
  let text = '';
  let completed;
  for await (const event of stream) {
    if (event.type === 'response.output_text.delta') {
      text += event.delta;
    } else if (event.type === 'response.completed') {
      completed = event.response;
    }
  }
  p.eq('streamed text', text, REPLY);
  p.eq('usage in response.completed', [completed?.usage?.input_tokens, completed?.usage?.output_tokens], [IN, OUT]);
});

await metered('responses-stream-helper', IN + OUT, async (p) => {
  const stream = client.responses.stream({ model: MODEL, input: 'Say hello.', max_output_tokens: MAX });
  let deltas = '';
  stream.on('response.output_text.delta', (event) => {
    deltas += event.delta;
  });
  const final = await stream.finalResponse();
  p.eq('final output_text', final.output_text, REPLY);
  p.eq('text deltas', deltas, REPLY);
  p.eq('usage', [final.usage?.input_tokens, final.usage?.output_tokens], [IN, OUT]);
});

// OpenAI's envelope: {"error": {"message", "type", "code", ...}}; the SDK holds its "error".
function envelope(err, p) {
  const e = err.error;
  if (!p.ok(e !== null && typeof e === 'object', `the body's "error" is ${JSON.stringify(e)}, not OpenAI's {"message","type","code"}`)) {
    return undefined;
  }
  p.ok(typeof e.message === 'string' && e.message !== '', `error.message is ${JSON.stringify(e.message)}`);
  p.ok(typeof e.type === 'string' && e.type !== '', `error.type is ${JSON.stringify(e.type)}`);
  p.ok('code' in e, `error has no "code"`);
  return e;
}

await metered('forbidden-model', 0, async (p) => {
  const counter = counting();
  const c = new OpenAI({ fetch: counter.fetch });
  await refused(p, {
    APIError: OpenAI.APIError,
    status: 403,
    counter,
    call: () => c.chat.completions.create({ model: OTHER, messages, max_completion_tokens: MAX }),
    texts: ['inference.model', MODEL, OTHER],
    envelope,
    roostSeen: false,
  });
});

// Last: a session's ceiling refusal latches, and every call after it is refused too.
await metered('ceiling', 0, async (p) => {
  const before = await spend();
  const asked = before.ceiling * 2;
  if (!p.ok(before.ceiling > 0, `the session has no ceiling (${JSON.stringify(before)})`)) {
    return;
  }
  const counter = counting();
  const c = new OpenAI({ fetch: counter.fetch });
  const got = await refused(p, {
    APIError: OpenAI.APIError,
    status: 429,
    counter,
    // Five answers of at least 256 tokens each: more than the whole ceiling, so the call is
    // refused rather than lowered to fit.
    call: () => c.chat.completions.create({ model: MODEL, messages, n: 5, max_completion_tokens: asked }),
    texts: [],
    envelope,
    roostSeen: false,
  });
  if (got) {
    ceilingDetail(p, got.err.message, got.roost, { ceiling: before.ceiling, used: before.charged, asked: 5 * 256 });
  }
});

finish();
