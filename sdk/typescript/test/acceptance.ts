// The SDK's acceptance over roostd's remote listener, run as a client on another host (or
// network namespace: TestSDKRemote in test/e2e runs it so). Through the facade alone it
// creates a sealed session with labels, writes a file, execs a command reading it with its
// output streamed, downloads the workdir as a tar, lists sessions by label, detaches an exec
// and re-attaches to it from an offset, and removes the session; then it is refused without
// a certificate (the SDK's own check, and a raw TLS handshake), with another CA's, and as a
// reader calling Kill. It prints one JSON line per step, {"step", "ok", ...what it saw}, and
// stops at the first step that fails, exiting 1.
//
// Environment: ROOST_SERVER (https://host:port), ROOST_CA, ROOST_CERT and ROOST_KEY (an
// operator's), ROOST_READER_CERT and ROOST_READER_KEY (a reader's), ROOST_OTHER_CERT and
// ROOST_OTHER_KEY (a client of another CA), ROOST_CAPSULE (a pushed sealed capsule's
// name@version whose allowlist holds sh, cat and sleep).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as tls from "node:tls";
import { Code } from "@connectrpc/connect";
import { NotFoundError, PermissionDeniedError, Roost, UnavailableError, type Session } from "../src/index.js";
import { readTar } from "./tar.js";

const sdk = "typescript";
const note = `written by the ${sdk} SDK\n`;

// grpcCode is a gRPC status code's canonical name ("permission_denied"), as the Python SDK's
// acceptance prints it too.
function grpcCode(code: Code): string {
  return Code[code].replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`).slice(1);
}

function env(name: string): string {
  const v = process.env[name];
  if (!v) {
    throw new Error(`acceptance: ${name} is not set`);
  }
  return v;
}

const server = env("ROOST_SERVER");
const ca = env("ROOST_CA");
const capsule = env("ROOST_CAPSULE");
const operator = { server, ca, cert: env("ROOST_CERT"), key: env("ROOST_KEY") };

async function step(name: string, fn: () => Promise<Record<string, unknown>>): Promise<void> {
  try {
    const seen = await fn();
    console.log(JSON.stringify({ step: name, ok: true, ...seen }));
  } catch (err) {
    console.log(JSON.stringify({ step: name, ok: false, error: `${(err as Error).name}: ${(err as Error).message}` }));
    throw err;
  }
}

// rawHandshake opens a TLS connection to the listener without a client certificate and says
// how it ended: TLS 1.3 finishes the client's side of the handshake before the server has
// judged the client, so the server's refusal comes as an alert after it.
function rawHandshake(): Promise<{ handshake: boolean; answered: boolean; error: string }> {
  const url = new URL(server);
  return new Promise((resolve) => {
    let handshake = false;
    let answered = false;
    const sock = tls.connect({ host: url.hostname, port: Number(url.port), ca: readFileSync(ca), ALPNProtocols: ["h2"] });
    sock.setTimeout(30_000, () => sock.destroy(new Error("no verdict from the server in 30s")));
    sock.on("secureConnect", () => (handshake = true));
    sock.on("data", () => (answered = true));
    sock.on("error", (err: NodeJS.ErrnoException) => resolve({ handshake, answered, error: err.code ?? err.message }));
    sock.on("close", () => resolve({ handshake, answered, error: "" }));
  });
}

async function main(): Promise<void> {
  const roost = Roost.connect(operator);
  let s: Session | undefined;
  let decoy: Session | undefined;
  try {
    await step("create", async () => {
      s = await roost.sessions.create({ capsule, labels: { acceptance: sdk, role: "main" } });
      decoy = await roost.sessions.create({ capsule, labels: { acceptance: sdk, role: "decoy" } });
      assert.equal(s.state, "running", s.record.detail);
      assert.equal(s.record.containment?.achieved, "sealed");
      assert.deepEqual(s.labels, { acceptance: sdk, role: "main" });
      return { id: s.id, decoy: decoy.id, state: s.state, achieved: s.record.containment?.achieved, labels: s.labels };
    });
    const sess = s!;

    await step("write", async () => {
      const info = await sess.files.write("note.txt", note);
      assert.equal(info.size, BigInt(Buffer.byteLength(note)));
      return { path: "note.txt", size: Number(info.size) };
    });

    await step("exec-stream", async () => {
      // The command prints the note, then waits for a file the client writes only once it
      // has seen that first chunk: exec cannot end unless its output came as a stream.
      const chunks: string[] = [];
      let go: Promise<unknown> | undefined;
      const r = await sess.exec("cat note.txt; while [ ! -e go ]; do sleep 0.05; done; echo done", {
        timeout: 120_000,
        onStdout: (data) => {
          chunks.push(data);
          if (data.includes(note)) {
            go ??= sess.files.write("go", "");
          }
        },
      });
      await go;
      assert.equal(r.exitCode, 0, `${r.detail}: ${r.stderr}`);
      assert.equal(r.stdout, note + "done\n");
      assert.equal(chunks.join(""), r.stdout);
      assert.ok(chunks.length >= 2, `the output came in ${chunks.length} chunk(s)`);
      return { chunks, stdout: r.stdout, exitCode: r.exitCode, firstChunkBeforeEnd: go !== undefined };
    });

    await step("download-tar", async () => {
      const parts: Uint8Array[] = [];
      for await (const c of sess.files.archive(".")) {
        parts.push(c);
      }
      const entries = readTar(Buffer.concat(parts));
      const got = entries.find((e) => e.name === "note.txt");
      assert.ok(got, `note.txt is not in the archive: ${entries.map((e) => e.name).join(" ")}`);
      assert.equal(got.type, "0");
      assert.equal(Buffer.from(got.data).toString("utf8"), note);
      return { names: entries.map((e) => e.name).sort(), note: Buffer.from(got.data).toString("utf8") };
    });

    await step("labels", async () => {
      const ids = async (labels: Record<string, string>) => (await roost.sessions.list({ labels })).map((x) => x.id).sort();
      const main = await ids({ acceptance: sdk, role: "main" });
      const any = await ids({ acceptance: sdk });
      assert.deepEqual(main, [sess.id]);
      assert.deepEqual(any, [sess.id, decoy!.id].sort());
      return { main, any };
    });

    let execId = "";
    await step("detach", async () => {
      const h = await sess.exec("echo one; while [ ! -e go2 ]; do sleep 0.05; done; echo two; exit 3", { background: true });
      execId = h.execId;
      // exec returned while the command waits for go2: it runs on, detached.
      const state = (await sess.execs()).find((x) => x.execId === execId)?.state;
      assert.equal(state, "running");
      return { execId, state };
    });

    await step("attach", async () => {
      await sess.files.write("go2", "");
      // A handle of its own, as another client's would be: from the exec's id alone.
      const offset = Buffer.byteLength("one\n");
      const chunks: string[] = [];
      const r = await sess.attachExec(execId).wait({ stdoutOffset: offset, onStdout: (data) => chunks.push(data) });
      assert.equal(r.stdout, "two\n");
      assert.equal(r.exitCode, 3, r.detail);
      assert.equal(chunks.join(""), "two\n");
      return { execId, offset, stdout: r.stdout, exitCode: r.exitCode };
    });

    await step("refuse-no-cert", async () => {
      // The SDK refuses before any call; a raw handshake without a certificate is refused by roostd.
      assert.throws(() => Roost.connect({ server, ca }), /cert is required/);
      const raw = await rawHandshake();
      assert.equal(raw.answered, false, "roostd answered a client without a certificate");
      assert.notEqual(raw.error, "", "the connection closed without the server's alert");
      return { sdk: "TypeError", raw: raw.error, rawHandshake: raw.handshake };
    });

    await step("refuse-other-ca", async () => {
      const stranger = Roost.connect({ server, ca, cert: env("ROOST_OTHER_CERT"), key: env("ROOST_OTHER_KEY") });
      try {
        const err = await stranger.version().then(
          () => assert.fail("a client of another CA was served"),
          (e: unknown) => e,
        );
        assert.ok(err instanceof UnavailableError, String(err));
        return { error: err.name, grpcCode: grpcCode(err.code) };
      } finally {
        stranger.close();
      }
    });

    await step("refuse-reader-kill", async () => {
      const reader = Roost.connect({ server, ca, cert: env("ROOST_READER_CERT"), key: env("ROOST_READER_KEY") });
      try {
        const seen = await reader.sessions.get(sess.id);
        assert.equal(seen.state, "running");
        const err = await seen.kill().then(
          () => assert.fail("a reader killed a session"),
          (e: unknown) => e,
        );
        assert.ok(err instanceof PermissionDeniedError, String(err));
        assert.match(err.message, /may not call \/roost\.v1\.SessionService\/Kill/);
        const after = (await sess.refresh()).state;
        assert.equal(after, "running");
        return { error: err.name, grpcCode: grpcCode(err.code), message: err.message, stateAfter: after };
      } finally {
        reader.close();
      }
    });

    await step("remove", async () => {
      await sess.kill();
      await sess.wait();
      await sess.remove();
      await decoy!.remove({ force: true });
      s = decoy = undefined;
      const err = await roost.sessions.get(sess.id).then(
        () => assert.fail("the removed session is still there"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof NotFoundError, String(err));
      return { id: sess.id, get: err.name };
    });
  } finally {
    await s?.remove({ force: true }).catch(() => {});
    await decoy?.remove({ force: true }).catch(() => {});
    roost.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
