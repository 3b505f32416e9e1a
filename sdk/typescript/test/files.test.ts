import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync, symlinkSync, readlinkSync, statSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { FileType, InvalidArgumentError, NotFoundError, FailedPreconditionError, Roost, type Session } from "../src/index.js";
import { Daemon } from "./daemon.js";
import { readTar } from "./tar.js";

let d: Daemon;
let roost: Roost;
let s: Session;
before(async () => {
  d = await Daemon.start();
  roost = Roost.connect({ socket: d.socket });
  s = await roost.sessions.create({ capsule: d.capsule("files", "echo made > made.txt; sleep 300") });
});
after(async () => {
  await s?.remove({ force: true }).catch(() => {});
  roost?.close();
  await d?.stop();
});

test("write, read, stat, list, mkdir, remove", async () => {
  const info = await s.files.write("notes.txt", "first\n", { mode: 0o600 });
  assert.equal(info.size, 6n);
  assert.equal(info.mode, 0o600);
  assert.equal(await s.files.read("notes.txt"), "first\n");
  // The session sees what was written, and the SDK what the session wrote.
  assert.equal((await s.exec("cat notes.txt")).stdout, "first\n");
  for (let i = 0; !(await s.files.exists("made.txt")) && i < 100; i++) {
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(await s.files.read("made.txt"), "made\n");

  const big = new Uint8Array(700_000).map((_, i) => i % 251);
  await s.files.write("big.bin", big);
  assert.deepEqual(new Uint8Array(await s.files.readBytes("big.bin")), big);
  assert.deepEqual(new Uint8Array(await s.files.readBytes("big.bin", { offset: 10, length: 5 })), big.subarray(10, 15));

  await s.files.mkdir("a/b/c", { parents: true });
  await s.files.write("a/b/c/x", "x");
  const names = (await s.files.list(".")).map((e) => e.name).sort();
  assert.deepEqual(names, ["a", "big.bin", "made.txt", "notes.txt"]);
  assert.equal((await s.files.stat("a")).type, FileType.DIRECTORY);

  await assert.rejects(s.files.read("nope"), NotFoundError);
  await assert.rejects(s.files.read("../etc/passwd"), InvalidArgumentError);
  await assert.rejects(s.files.write("/etc/x", "x"), InvalidArgumentError);
  await assert.rejects(s.files.remove("a"), FailedPreconditionError);
  await s.files.remove("a", { recursive: true });
  assert.equal(await s.files.exists("a"), false);
});

test("upload and download a tree", async () => {
  const local = mkdtempSync(path.join(tmpdir(), "roost-sdk-ts-tree-"));
  try {
    mkdirSync(path.join(local, "src", "lib"), { recursive: true });
    writeFileSync(path.join(local, "src", "main.py"), "print('hi')\n");
    writeFileSync(path.join(local, "src", "lib", "util.py"), "X = 1\n");
    symlinkSync("main.py", path.join(local, "src", "link"));
    const up = await s.upload(path.join(local, "src"), "proj");
    assert.equal(up.files, 2n);
    assert.equal(up.symlinks, 1n);
    assert.equal((await s.exec("cat proj/lib/util.py")).stdout, "X = 1\n");

    const back = path.join(local, "back");
    await s.download("proj", back);
    assert.equal(readFileSync(path.join(back, "main.py"), "utf8"), "print('hi')\n");
    assert.equal(readFileSync(path.join(back, "lib", "util.py"), "utf8"), "X = 1\n");
    assert.equal(readlinkSync(path.join(back, "link")), "main.py");
    assert.equal(statSync(path.join(back, "main.py")).uid, process.getuid!());

    // What a session wrote does not come out as a setuid program of this host's.
    const r = await s.exec("mkdir -p suid && printf x > suid/prog && chmod 4755 suid/prog && ln -s /tmp suid/out");
    assert.equal(r.exitCode, 0, r.stderr);
    const suid = path.join(local, "suid");
    await s.download("suid", suid);
    assert.equal(statSync(path.join(suid, "prog")).mode & 0o7777, 0o755);
    assert.equal(readlinkSync(path.join(suid, "out")), "/tmp");
  } finally {
    rmSync(local, { recursive: true, force: true });
  }
});

test("archive is a workdir's tree as a tar stream", async () => {
  await s.files.mkdir("arch/sub", { parents: true });
  await s.files.write("arch/sub/a.txt", "in the archive\n");
  const big = new Uint8Array(600_000).map((_, i) => i % 253);
  await s.files.write("arch/big.bin", big);
  const chunks: Uint8Array[] = [];
  for await (const c of s.files.archive("arch")) {
    chunks.push(c);
  }
  // Streamed, not sent whole: more than roostd's one piece of an archive.
  assert.ok(chunks.length > 1, `${chunks.length} chunk(s)`);
  const entries = readTar(Buffer.concat(chunks));
  assert.deepEqual(entries.map((e) => `${e.type} ${e.name}`).sort(), ["0 big.bin", "0 sub/a.txt", "5 sub/"]);
  assert.equal(Buffer.from(entries.find((e) => e.name === "sub/a.txt")!.data).toString(), "in the archive\n");
  assert.deepEqual(new Uint8Array(entries.find((e) => e.name === "big.bin")!.data), big);
  // The whole workdir by default; a path roostd refuses is its error, at the first read.
  const all = readTar(Buffer.concat(await collect(s.files.archive())));
  assert.ok(all.some((e) => e.name === "arch/sub/a.txt"), all.map((e) => e.name).join(" "));
  await assert.rejects(collect(s.files.archive("../etc")), InvalidArgumentError);
  await assert.rejects(collect(s.files.archive("nope")), NotFoundError);
  await s.files.remove("arch", { recursive: true });
});

async function collect(it: AsyncIterable<Uint8Array>): Promise<Uint8Array[]> {
  const out: Uint8Array[] = [];
  for await (const c of it) {
    out.push(c);
  }
  return out;
}

test("a file many receive windows long reads back whole", async () => {
  // 20 MiB: five of a stream's windows, more than two of the connection's (src/transport.ts).
  const big = new Uint8Array(20 << 20).map((_, i) => (i * 7) % 253);
  await s.files.write("windows.bin", big);
  const back = await s.files.readBytes("windows.bin");
  assert.equal(back.length, big.length);
  assert.ok(Buffer.compare(Buffer.from(back), Buffer.from(big)) === 0, "the bytes read differ from those written");
  assert.equal((await s.exec("cat windows.bin | wc -c")).stdout.trim(), String(20 << 20));
});
