import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { PermissionDeniedError, Roost, RoostError, UnavailableError } from "../src/index.js";
import { Daemon } from "./daemon.js";

let d: Daemon;
before(async () => {
  d = await Daemon.remote();
});
after(async () => {
  await d?.stop();
});

test("over mTLS: a pushed capsule, exec, kill, remove", async () => {
  const roost = Roost.connect(d.as("sdk"));
  try {
    // Paths are roostd's over the listener: this host is roostd's here.
    const art = await roost.artifacts.push(d.capsule("remote", "sleep 300"));
    const s = await roost.sessions.create({ capsule: `${art.name}@${art.version}` });
    assert.equal(s.state, "running");
    const r = await s.exec(["/bin/sh", "-c", "cat; echo $X"], { stdin: "in\n", env: { X: "over tls" } });
    assert.equal(r.stdout, "in\nover tls\n");
    await s.kill();
    assert.equal((await s.wait()).exitStatus, "terminated");
    await s.remove();
  } finally {
    roost.close();
  }
});

test("a reader reads and may not kill", async () => {
  const op = Roost.connect(d.as("sdk"));
  const viewer = Roost.connect(d.as("viewer"));
  try {
    const s = await op.sessions.create({ capsule: d.capsule("watched", "sleep 300") });
    const seen = await viewer.sessions.get(s.id);
    assert.equal(seen.state, "running");
    await assert.rejects(seen.kill(), PermissionDeniedError);
    await s.remove({ force: true });
  } finally {
    op.close();
    viewer.close();
  }
});

test("a certificate of another CA is refused", async () => {
  const stranger = Roost.connect({ ...d.as("stranger"), ca: d.as("sdk").ca });
  try {
    await assert.rejects(stranger.version(), (err) => {
      assert.ok(err instanceof RoostError, String(err));
      assert.ok(err instanceof UnavailableError, `${err.name}: ${err.message}`);
      return true;
    });
  } finally {
    stranger.close();
  }
});

test("server without a client certificate is refused before any call", () => {
  assert.throws(() => Roost.connect({ server: d.server, ca: d.as("sdk").ca }), /cert is required/);
});
