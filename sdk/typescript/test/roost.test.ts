import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as path from "node:path";
import {
  DeadlineExceededError,
  FailedPreconditionError,
  InvalidArgumentError,
  NotFoundError,
  Roost,
  RoostError,
  UnavailableError,
  AlreadyExistsError,
} from "../src/index.js";
import { Daemon } from "./daemon.js";

describe("roost over its unix socket", () => {
  let d: Daemon;
  let roost: Roost;
  before(async () => {
    d = await Daemon.start();
    roost = Roost.connect({ socket: d.socket });
  });
  after(async () => {
    for (const s of await roost.sessions.list()) {
      await s.kill().catch(() => {});
    }
    roost?.close();
    await d?.stop();
  });

  test("create, exec, kill, wait, remove", async () => {
    const s = await roost.sessions.create({ capsule: d.capsule("sleeper", "echo started; sleep 300"), name: "ts-sleeper" });
    assert.equal(s.state, "running");
    assert.match(s.id, /^ses_/);
    assert.equal(s.name, "ts-sleeper");

    const r = await s.exec("echo out; echo err >&2; exit 3");
    assert.equal(r.exitCode, 3);
    assert.equal(r.stdout, "out\n");
    assert.equal(r.stderr, "err\n");
    assert.match(r.output, /out\n/);
    assert.match(r.detail, /3/);
    assert.notEqual(r.execId, "");

    const argv = await s.exec(["/bin/sh", "-c", 'printf "%s|%s|" "$GREETING" "$(pwd)"; cat'], {
      env: { GREETING: "hi there" },
      cwd: "/tmp",
      stdin: "from stdin",
    });
    assert.equal(argv.exitCode, 0, argv.stderr);
    assert.equal(argv.stdout, "hi there|/tmp|from stdin");

    // The same session by name and by id.
    assert.equal((await roost.sessions.get("ts-sleeper")).id, s.id);
    assert.ok((await roost.sessions.list()).some((x) => x.id === s.id));

    const started = Date.now();
    await assert.rejects(s.exec("sleep 30", { timeout: 500 }), DeadlineExceededError);
    assert.ok(Date.now() - started < 10_000, "the timeout ended the exec");

    const killed = await s.kill();
    assert.equal(killed.state, "exited");
    const ended = await s.wait();
    assert.equal(ended.exitStatus, "terminated");
    assert.equal(s.exitCode, 137);
    assert.equal((await s.logs()).stdout, "started\n");

    await assert.rejects(s.exec("true"), FailedPreconditionError);
    await s.remove();
    await assert.rejects(roost.sessions.get(s.id), NotFoundError);
  });

  test("labels at create, selected by list", async () => {
    const a = await roost.sessions.create({ capsule: d.capsule("labelled", "sleep 300"), labels: { team: "infra", "roost.example/tier": "gold" } });
    const b = await roost.sessions.create({ capsule: d.capsule("labelled", "sleep 300"), labels: { team: "web" } });
    try {
      assert.deepEqual(a.labels, { team: "infra", "roost.example/tier": "gold" });
      assert.deepEqual((await roost.sessions.get(a.id)).labels, a.labels);
      const ids = async (labels: Record<string, string>) => (await roost.sessions.list({ labels })).map((s) => s.id).sort();
      assert.deepEqual(await ids({ team: "infra" }), [a.id]);
      assert.deepEqual(await ids({ team: "" }), [a.id, b.id].sort());
      assert.deepEqual(await ids({ team: "web", "roost.example/tier": "" }), []);
      await assert.rejects(roost.sessions.create({ capsule: d.capsule("labelled", "true"), labels: { "-bad": "x" } }), InvalidArgumentError);
    } finally {
      await a.remove({ force: true });
      await b.remove({ force: true });
    }
  });

  test("background execs: wait, kill, list", async () => {
    const s = await roost.sessions.create({ capsule: d.capsule("background", "sleep 300") });
    try {
      const h = await s.exec("echo out; echo err >&2; exit 4", { background: true });
      assert.notEqual(h.execId, "");
      const r = await h.wait();
      assert.deepEqual([r.exitCode, r.stdout, r.stderr], [4, "out\n", "err\n"]);

      const long = await s.exec(["sleep", "300"], { background: true });
      const killed = await long.kill();
      assert.equal(killed.execId, long.execId);
      const ended = await long.wait();
      assert.equal(ended.exitCode, 137, ended.detail);
      const execs = await s.execs();
      assert.deepEqual(execs.map((x) => x.execId), [h.execId, long.execId]);
      assert.equal(execs[1].signal, "SIGKILL");

      // A command the session cannot run is a handle already ended.
      const refused = await s.exec(["/nonexistent/prog"], { background: true });
      assert.equal((await refused.wait()).exitCode, 127);
      await assert.rejects(refused.kill(), FailedPreconditionError);
    } finally {
      await s.remove({ force: true });
    }
  });

  test("exec streams its output as it is written", async () => {
    const s = await roost.sessions.create({ capsule: d.capsule("streamed", "sleep 300") });
    try {
      // The command ends only once the caller has seen its first line: had exec kept the
      // output until the command's end, it would run into its timeout instead.
      const seen: string[] = [];
      let go: Promise<unknown> | undefined;
      const r = await s.exec("echo ready; echo warn >&2; while [ ! -e go ]; do sleep 0.05; done; echo done", {
        timeout: 60_000,
        onStdout: (data) => {
          seen.push(data);
          if (data.includes("ready")) {
            go ??= s.files.write("go", "");
          }
        },
        onStderr: (data) => seen.push(`err:${data}`),
      });
      await go;
      assert.equal(r.exitCode, 0, r.stderr);
      assert.equal(r.stdout, "ready\ndone\n");
      assert.equal(seen.filter((x) => !x.startsWith("err:")).join(""), r.stdout);
      assert.deepEqual(seen.filter((x) => x.startsWith("err:")), ["err:warn\n"]);
    } finally {
      await s.remove({ force: true });
    }
  });

  test("a background exec re-attached from an offset", async () => {
    const s = await roost.sessions.create({ capsule: d.capsule("reattach", "sleep 300") });
    try {
      const h = await s.exec("echo one; while [ ! -e go ]; do sleep 0.05; done; echo two; echo bad >&2; exit 5", { background: true });
      // exec returned while the command waits: it runs on, detached.
      assert.equal((await s.execs()).find((x) => x.execId === h.execId)?.state, "running");
      await s.files.write("go", "");
      const again = s.attachExec(h.execId);
      const seen: string[] = [];
      const r = await again.wait({ stdoutOffset: Buffer.byteLength("one\n"), onStdout: (data) => seen.push(data) });
      assert.deepEqual([r.exitCode, r.stdout, r.stderr], [5, "two\n", "bad\n"]);
      assert.equal(seen.join(""), "two\n");
      assert.equal((await again.wait()).stdout, "one\ntwo\n");
      assert.throws(() => s.attachExec(""), TypeError);
      await assert.rejects(s.attachExec("exec_000000000000").wait(), NotFoundError);
    } finally {
      await s.remove({ force: true });
    }
  });

  test("wait returns the program's exit code", async () => {
    const s = await roost.sessions.create({ capsule: d.capsule("three", "exit 3") });
    const ended = await s.wait();
    assert.equal(ended.exitCode, 3);
    assert.equal(ended.exitStatus, "error");
    await s.remove();
  });

  test("a relative capsule path is taken from the working directory", async () => {
    const dir = d.capsule("relative", "exit 0");
    const cwd = process.cwd();
    process.chdir(path.dirname(dir));
    try {
      const s = await roost.sessions.create({ capsule: "relative" });
      assert.equal(s.record.capsule?.source, dir);
      await s.wait();
      await s.remove();
    } finally {
      process.chdir(cwd);
    }
  });

  test("a pushed capsule by name@version", async () => {
    const art = await roost.artifacts.push(d.capsule("pushed", "echo pushed"));
    assert.equal(`${art.name}@${art.version}`, "pushed@0.1.0");
    const s = await roost.sessions.create({ capsule: "pushed@0.1.0" });
    await s.wait();
    assert.equal((await s.logs()).stdout, "pushed\n");
    await s.remove();
    await roost.artifacts.remove("pushed@0.1.0");
    await assert.rejects(roost.sessions.create({ capsule: "pushed@0.1.0" }), NotFoundError);
  });

  test("errors are typed from roostd's codes", async () => {
    await assert.rejects(roost.sessions.get("ses_nosuchsession"), (err) => {
      assert.ok(err instanceof NotFoundError && err instanceof RoostError, String(err));
      assert.match(err.message, /ses_nosuchsession/);
      return true;
    });
    await assert.rejects(roost.sessions.create({ capsule: d.capsule("badname", "true"), name: "Not A Name" }), InvalidArgumentError);
    const s = await roost.sessions.create({ capsule: d.capsule("taken", "sleep 300"), name: "taken" });
    await assert.rejects(roost.sessions.create({ capsule: d.capsule("taken", "sleep 300"), name: "taken" }), AlreadyExistsError);
    await s.remove({ force: true });
    await assert.rejects(roost.sessions.create({ capsule: "" }), TypeError);
  });
});

test("an unreachable socket is UnavailableError", async () => {
  const roost = Roost.connect({ socket: "/nonexistent/roostd.sock" });
  try {
    await assert.rejects(roost.version(), UnavailableError);
  } finally {
    roost.close();
  }
});
