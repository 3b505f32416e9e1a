// A real roostd for the tests: started on a temporary state directory and socket, from
// $ROOST_BIN (a directory holding roostd and roost-init), else the repository's bin/.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { Roost } from "../src/index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
// dist/test -> the repository's root.
const repo = path.resolve(here, "..", "..", "..", "..");

export class Daemon {
  readonly dir: string;
  readonly socket: string;
  private proc: ChildProcess;
  log = "";

  private constructor(dir: string, proc: ChildProcess, socket: string) {
    this.dir = dir;
    this.proc = proc;
    this.socket = socket;
  }

  static async start(...args: string[]): Promise<Daemon> {
    const bin = process.env.ROOST_BIN ?? path.join(repo, "bin");
    const dir = mkdtempSync(path.join(tmpdir(), "roost-sdk-ts-"));
    // Sessions' unprivileged uids pass through the state directory's parent, as /var/lib.
    chmodSync(dir, 0o711);
    const state = path.join(dir, "state");
    const socket = path.join(dir, "roostd.sock");
    const proc = spawn(path.join(bin, "roostd"), ["--state-dir", state, "--socket", socket, "--metrics-addr", "", ...args], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    const d = new Daemon(dir, proc, socket);
    proc.stdout!.on("data", (b) => (d.log += b));
    proc.stderr!.on("data", (b) => (d.log += b));
    const roost = Roost.connect({ socket });
    try {
      for (const until = Date.now() + 15_000; ; await new Promise((r) => setTimeout(r, 50))) {
        if (proc.exitCode !== null) {
          throw new Error(`roostd exited with ${proc.exitCode}:\n${d.log}`);
        }
        try {
          await roost.version();
          return d;
        } catch (err) {
          if (Date.now() > until) {
            throw new Error(`roostd did not come up (${err}):\n${d.log}`);
          }
        }
      }
    } finally {
      roost.close();
    }
  }

  /** capsule writes a capsule directory running script under /bin/sh. */
  capsule(name: string, script: string, extra = "capabilities:\n  containment: advisory\n"): string {
    const dir = path.join(this.dir, "capsules", name);
    mkdirSync(dir, { recursive: true });
    writeFileSync(
      path.join(dir, "capsule.yaml"),
      `name: ${name}\nversion: 0.1.0\nrun:\n  command: ${JSON.stringify(["/bin/sh", "-c", script])}\n${extra}`,
    );
    return dir;
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode === null) {
      const ended = new Promise((r) => this.proc.once("exit", r));
      this.proc.kill("SIGTERM");
      await ended;
    }
    unmountUnder(this.dir);
    rmSync(this.dir, { recursive: true, force: true, maxRetries: 3 });
  }
}

// unmountUnder detaches every mount at or beneath dir, deepest first: roostd seals its
// session trees with binds it leaves for the next roostd, and the directory could not be
// removed with them there (EBUSY).
function unmountUnder(dir: string): void {
  const points = readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((line) => line.split(" ")[4])
    .filter((p): p is string => p !== undefined && (p === dir || p.startsWith(dir + "/")))
    .sort((a, b) => b.length - a.length);
  for (const p of points) {
    const r = spawnSync("umount", ["-l", p], { encoding: "utf8" });
    if (r.status !== 0) {
      throw new Error(`umount -l ${p}: ${r.stderr}`);
    }
  }
}
