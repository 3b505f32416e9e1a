import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { Manifest, SandboxLifecycleError, SandboxPathResolutionError, SandboxUnsupportedFeatureError } from "@openai/agents/sandbox";
import { NotFoundError, Roost } from "../src/index.js";
import { RoostSandboxClient, type RoostSandboxSession } from "../src/openai-agents.js";
import { Daemon } from "./daemon.js";

describe("the OpenAI Agents SDK sandbox client over a real roostd", () => {
  let d: Daemon;
  let roost: Roost;
  let client: RoostSandboxClient;
  before(async () => {
    d = await Daemon.start();
    roost = Roost.connect({ socket: d.socket });
    client = new RoostSandboxClient(roost, { capsule: d.capsule("oa-sandbox", "exec sleep 300"), timeout: 30 });
  });
  after(async () => {
    for (const s of await roost.sessions.list()) {
      await s.kill().catch(() => {});
    }
    roost?.close();
    await d?.stop();
  });

  const manifest = {
    entries: {
      "README.md": { type: "file" as const, content: "read me\n" },
      src: { type: "dir" as const, children: { "main.txt": { type: "file" as const, content: "one\ntwo\nthree\n" } } },
    },
    environment: { GREETING: "hi there" },
  };

  test("create: a running session of the capsule, the manifest's files in its workdir, its root the workdir", async () => {
    const s = await client.create({ manifest, options: { labels: { via: "openai-agents" } } });
    assert.equal(s.session.state, "running");
    assert.deepEqual(s.session.labels, { via: "openai-agents" });
    assert.equal(s.state.sessionId, s.session.id);
    assert.equal(s.state.manifest.root, s.session.record.workdir);
    assert.equal(s.state.workspaceReady, true);
    assert.equal(await s.session.files.read("README.md"), "read me\n");
    assert.equal(await s.session.files.read("src/main.txt"), "one\ntwo\nthree\n");
    assert.equal(await s.running(), true);
  });

  test("exec and execCommand: the session's commands, in the root or a directory of it, with the manifest's environment", async () => {
    const s = await client.create({ manifest });
    const r = await s.exec({ cmd: 'printf "%s|%s|" "$GREETING" "$(pwd)"; cat /proc/self/cgroup; echo err >&2; exit 3' });
    assert.equal(r.exitCode, 3);
    assert.ok(r.stdout.startsWith(`hi there|${s.state.manifest.root}|`), r.stdout);
    assert.match(r.stdout, new RegExp(`/roost/${s.session.id}`));
    assert.equal(r.stderr, "err\n");
    const sub = await s.exec({ cmd: "pwd", workdir: "src" });
    assert.equal(sub.stdout, `${s.state.manifest.root}/src\n`);
    const formatted = await s.execCommand({ cmd: "echo formatted" });
    assert.match(formatted, /Process exited with code 0\nOutput:\nformatted\n$/);
    const cut = await s.execCommand({ cmd: "seq 1 2000", maxOutputTokens: 10 });
    assert.match(cut, /Original token count: \d+/);
    assert.match(cut, /tokens truncated/);
    await assert.rejects(s.exec({ cmd: "true", tty: true }), SandboxUnsupportedFeatureError);
    await assert.rejects(s.exec({ cmd: "true", runAs: "bob" }), SandboxUnsupportedFeatureError);
    await assert.rejects(s.exec({ cmd: "pwd", workdir: "/etc" }), SandboxPathResolutionError);
  });

  test("a command past the client's timeout is killed, exit code 124", async () => {
    const quick = new RoostSandboxClient(roost, { capsule: d.capsule("oa-quick", "exec sleep 300"), timeout: 1 });
    const s = await quick.create();
    const r = await s.exec({ cmd: "sleep 30" });
    assert.equal(r.exitCode, 124);
    assert.match(r.output, /past its 1s timeout/);
  });

  test("files: read, list, exists, and the editor's create, update, move and delete", async () => {
    const s = await client.create({ manifest });
    const root = s.state.manifest.root;
    assert.equal(Buffer.from(await s.readFile({ path: "src/main.txt" })).toString(), "one\ntwo\nthree\n");
    assert.equal(Buffer.from(await s.readFile({ path: `${root}/src/main.txt`, maxBytes: 3 })).toString(), "one");
    const listed = (await s.listDir({ path: "." })).map((e) => [e.name, e.path, e.type]).sort();
    assert.deepEqual(listed, [
      ["README.md", `${root}/README.md`, "file"],
      ["src", `${root}/src`, "dir"],
    ]);
    assert.equal(await s.pathExists("README.md"), true);
    assert.equal(await s.pathExists("nope"), false);
    assert.equal(await s.directoryExists("src"), true);
    assert.equal(await s.directoryExists("README.md"), false);
    assert.equal(await s.directoryExists("nope"), false);
    await assert.rejects(s.readFile({ path: "/etc/passwd" }), SandboxPathResolutionError);
    await assert.rejects(s.readFile({ path: "../outside" }), SandboxPathResolutionError);

    const editor = s.createEditor();
    // The SDK's applyDiff makes a created file's text, as its own sandboxes do: no last newline.
    assert.deepEqual(await editor.createFile({ type: "create_file", path: "notes/new.txt", diff: "+alpha\n+beta\n" }), { output: "Created notes/new.txt" });
    assert.equal(await s.session.files.read("notes/new.txt"), "alpha\nbeta");
    await editor.updateFile({ type: "update_file", path: `${root}/src/main.txt`, diff: "@@\n one\n-two\n+TWO\n three\n" });
    assert.equal(await s.session.files.read("src/main.txt"), "one\nTWO\nthree\n");
    assert.deepEqual(await editor.updateFile({ type: "update_file", path: "notes/new.txt", diff: "", moveTo: "moved/new.txt" }), {
      output: "Updated notes/new.txt and moved it to moved/new.txt",
    });
    assert.equal(await s.session.files.read("moved/new.txt"), "alpha\nbeta");
    assert.equal(await s.session.files.exists("notes/new.txt"), false);
    await editor.deleteFile({ type: "delete_file", path: "moved/new.txt" });
    assert.equal(await s.session.files.exists("moved/new.txt"), false);
    await assert.rejects(editor.createFile({ type: "create_file", path: "/tmp/x", diff: "+x\n" }), SandboxPathResolutionError);

    // A PNG's first bytes are enough to be one.
    const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0]);
    await s.session.files.write("pic.png", png);
    const img = await s.viewImage({ path: "pic.png" });
    assert.equal(img.type, "image");
    assert.deepEqual(img.image, { data: Uint8Array.from(png), mediaType: "image/png" });
    await assert.rejects(s.viewImage({ path: "README.md" }), /not a supported image/);

    await s.materializeEntry({ path: "later/added.txt", entry: { type: "file", content: "added" } });
    assert.equal(await s.session.files.read("later/added.txt"), "added");
    await s.applyManifest(new Manifest({ entries: { "applied.txt": { type: "file", content: "applied" } } }));
    assert.equal(await s.session.files.read("applied.txt"), "applied");
  });

  test("persistWorkspace is a tar of the workdir, which hydrateWorkspace unpacks into another session", async () => {
    const from = await client.create({ manifest });
    await from.session.files.write("src/extra.bin", new Uint8Array([0, 1, 2, 255]));
    const tar = await from.persistWorkspace();
    assert.ok(tar.byteLength >= 1024 && tar.byteLength % 512 === 0, `a tar archive of ${tar.byteLength} bytes`);
    const to = await client.create();
    assert.equal(await to.session.files.exists("README.md"), false);
    await to.hydrateWorkspace(tar);
    assert.equal(await to.session.files.read("README.md"), "read me\n");
    assert.deepEqual(await to.session.files.readBytes("src/extra.bin"), Buffer.from([0, 1, 2, 255]));
    await assert.rejects(to.hydrateWorkspace(tar, { archiveLimits: { maxInputBytes: 100 } }), /over its limit of 100/);
  });

  test("serialize, deserialize and resume reach the same session; close ends it, delete removes it", async () => {
    const s = await client.create({ manifest });
    const raw = await client.serializeSessionState(s.state);
    assert.deepEqual(raw, { sessionId: s.session.id, timeout: 30 });
    const state = await client.deserializeSessionState({ ...raw, manifest: s.state.manifest });
    const resumed: RoostSandboxSession = await client.resume(state);
    assert.equal(resumed.session.id, s.session.id);
    assert.equal(resumed.state.manifest.root, s.state.manifest.root);
    assert.equal((await resumed.exec({ cmd: "cat README.md" })).stdout, "read me\n");
    await assert.rejects(client.deserializeSessionState({ timeout: 30 }), /sessionId is undefined/);

    await resumed.close();
    assert.equal((await roost.sessions.get(s.session.id)).state, "exited");
    assert.equal(await s.running(), false);
    await assert.rejects(client.resume(state), SandboxLifecycleError);
    // Its record and files stay until it is removed.
    assert.equal(await (await roost.sessions.get(s.session.id)).files.read("README.md"), "read me\n");
    await client.delete(state);
    await assert.rejects(roost.sessions.get(s.session.id), NotFoundError);
    await assert.rejects(client.resume(state), /not on roostd/);
  });

  test("what a roost session cannot hold is refused, naming it", async () => {
    await assert.rejects(new RoostSandboxClient(roost).create(), /options.capsule is required/);
    await assert.rejects(client.create({ manifest: { entries: { code: { type: "local_dir", src: "/tmp" } } } }), /manifest entry code is a local_dir/);
    await assert.rejects(client.create({ manifest: { root: "/elsewhere" } }), /the manifest's root \/elsewhere/);
    await assert.rejects(client.create({ manifest: { users: [{ name: "bob" }] } }), /users \(bob\)/);
  });
});
