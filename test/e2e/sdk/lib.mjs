// What openai.mjs and anthropic.mjs share. Each runs in a sealed session of roost, against
// roost's inference gateway, with nothing but the environment roost sets; each check prints
// one line, "ok NAME" or "FAIL NAME: why; why", and indented lines of detail after it.
// test/e2e/sdk_test.go reads those lines.

import { readFileSync } from 'node:fs';

export function env(name) {
  const v = process.env[name];
  if (!v) {
    throw new Error(`${name} is not set`);
  }
  return v;
}

/** The versions that run: the test reports them. */
export function versions(...packages) {
  const version = (p) => JSON.parse(readFileSync(new URL(`./node_modules/${p}/package.json`, import.meta.url))).version;
  return [`node ${process.version}`, ...packages.map((p) => `${p} ${version(p)}`)].join(', ');
}

let failures = 0;

/** Problems collects what is wrong in one check; a check passes when there is nothing. */
export class Problems {
  constructor() {
    this.list = [];
    this.notes = [];
  }
  fail(why) {
    this.list.push(why);
  }
  ok(cond, why) {
    if (!cond) {
      this.fail(why);
    }
    return cond;
  }
  eq(what, got, want) {
    const g = JSON.stringify(got);
    const w = JSON.stringify(want);
    return this.ok(g === w, `${what}: got ${g}, want ${w}`);
  }
  note(s) {
    this.notes.push(s);
  }
}

const CHECK_TIMEOUT_MS = 30_000;

/** check runs fn(problems) and prints its verdict; a throw or a hang is a failure too. */
export async function check(name, fn) {
  const p = new Problems();
  let timer;
  try {
    await Promise.race([
      fn(p),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no result in ${CHECK_TIMEOUT_MS} ms`)), CHECK_TIMEOUT_MS);
      }),
    ]);
  } catch (err) {
    p.fail(`threw ${describe(err)}`);
  } finally {
    clearTimeout(timer);
  }
  if (p.list.length === 0) {
    console.log(`ok ${name}`);
  } else {
    failures++;
    console.log(`FAIL ${name}: ${p.list.join('; ')}`);
  }
  for (const n of p.notes) {
    console.log(`  ${name}: ${n}`);
  }
}

export function describe(err) {
  if (err && typeof err === 'object') {
    const status = err.status ? ` (status ${err.status})` : '';
    return `${err.constructor?.name ?? 'Error'}${status}: ${err.message}${err.cause ? ` [cause: ${err.cause.message ?? err.cause}]` : ''}`;
  }
  return String(err);
}

/** finish exits 1 when any check failed, so the session's exit says so too. */
export function finish() {
  console.log(failures === 0 ? 'all checks passed' : `${failures} checks failed`);
  process.exitCode = failures === 0 ? 0 : 1;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * spend is the session's account in roost's ledger (GET $ROOST_ENDPOINT/v1/spend), read once
 * no reservation is open: the gateway settles a call after relaying its answer.
 */
export async function spend() {
  for (let i = 0; ; i++) {
    const res = await fetch(`${env('ROOST_ENDPOINT')}/v1/spend`, {
      headers: { Authorization: `Bearer ${env('ROOST_CREDENTIAL')}` },
    });
    const text = await res.text();
    if (!res.ok) {
      throw new Error(`GET /v1/spend: ${res.status} ${text}`);
    }
    const s = JSON.parse(text);
    if (s.reserved === 0 || i >= 100) {
      return s;
    }
    await sleep(50);
  }
}

/**
 * metered runs a check that makes model calls and holds the ledger to them: the session's
 * charge grows by exactly `tokens` (the usage the upstream reported; 0 for a call roost
 * refuses or never charges).
 */
export function metered(name, tokens, fn) {
  return check(name, async (p) => {
    const before = await spend();
    await fn(p);
    const after = await spend();
    p.eq('the ledger charged (tokens)', after.charged - before.charged, tokens);
    p.eq('reservations left open (tokens)', after.reserved, 0);
  });
}

/**
 * counting is a fetch that counts the SDK's attempts: a client built with it ({fetch}) is
 * otherwise configured from the environment, as new OpenAI() / new Anthropic() is.
 */
export function counting() {
  const c = {
    attempts: 0,
    fetch: (url, init) => {
      c.attempts++;
      return fetch(url, init);
    },
  };
  return c;
}

/**
 * refused makes a call roost must refuse, through a counting client, and checks what every
 * refusal shares: the SDK throws its APIError with the status, at once (one attempt: the
 * SDK's own retry would be a second, after at least 375 ms), the answer says not to retry,
 * the SDK's message carries roost's text, and nothing is charged. envelope(err, p) checks the
 * provider's error shape and returns the object holding roost's field. roostSeen says whether
 * the SDK exposes roost's top-level "roost" field: the Anthropic SDK keeps the whole body, the
 * OpenAI SDK only its "error" object, so there it is checked only if it is inside that.
 */
export async function refused(p, { APIError, status, call, counter, texts, envelope, roostSeen }) {
  const started = Date.now();
  let err;
  try {
    const res = await call();
    p.fail(`the call succeeded: ${JSON.stringify(res).slice(0, 300)}`);
    return undefined;
  } catch (e) {
    err = e;
  }
  const elapsed = Date.now() - started;
  p.note(`${counter.attempts} attempt(s), ${elapsed} ms; message: ${err?.message}`);
  if (!p.ok(err instanceof APIError, `threw ${describe(err)}, not the SDK's APIError`)) {
    return undefined;
  }
  p.eq('status', err.status, status);
  p.ok(counter.attempts === 1, `the SDK made ${counter.attempts} attempts (retried a permanent refusal) in ${elapsed} ms`);
  p.eq('x-should-retry', err.headers?.get('x-should-retry') ?? null, 'false');
  for (const t of texts) {
    p.ok(String(err.message).includes(String(t)), `the SDK's message lacks roost's ${JSON.stringify(String(t))}: ${JSON.stringify(err.message)}`);
  }
  const holder = envelope(err, p);
  const roost = holder?.roost;
  if (roostSeen) {
    p.ok(roost !== undefined && roost !== null, `no "roost" field in the error body the SDK holds (${JSON.stringify(err.error)})`);
  } else if (roost === undefined) {
    p.note('no "roost" field in what the SDK keeps of the body (its "error" object); roost\'s detail reaches the program only in the message');
  }
  p.note(`error body as the SDK holds it: ${JSON.stringify(err.error)}`);
  return { err, roost, elapsed };
}

/** ceilingDetail checks roost's detail of a session-ceiling refusal in message and roost field. */
export function ceilingDetail(p, message, roost, { ceiling, used, asked }) {
  for (const t of ['max_session_tokens', String(ceiling), String(used)]) {
    p.ok(message.includes(t), `the message lacks ${JSON.stringify(t)} (limit, ceiling, used): ${JSON.stringify(message)}`);
  }
  const numbers = (message.match(/\d+/g) ?? []).map(Number);
  p.ok(numbers.some((n) => n >= asked), `the message names no request of ${asked} tokens or more (requested): ${JSON.stringify(message)}`);
  if (roost && typeof roost === 'object') {
    p.eq('roost.limit', roost.limit, 'session');
    p.eq('roost.ceiling', Number(roost.ceiling), ceiling);
    p.eq('roost.used', Number(roost.used), used);
    p.ok(Number(roost.requested) >= asked, `roost.requested ${JSON.stringify(roost.requested)} is under the ${asked} tokens asked`);
  } else if (roost !== undefined) {
    p.fail(`the roost field is ${JSON.stringify(roost)}, not an object with limit, ceiling, used, requested`);
  }
}
