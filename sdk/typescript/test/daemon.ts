// A real roostd for the tests: started on a temporary state directory and socket, from
// $ROOST_BIN (a directory holding roostd and roost-init), else the repository's bin/.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { Roost, type ConnectOptions } from "../src/index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
// dist/test -> the repository's root.
const repo = path.resolve(here, "..", "..", "..", "..");

export class Daemon {
  readonly dir: string;
  readonly socket: string;
  /** The remote listener's address, when started with remote(). */
  server = "";
  private proc: ChildProcess;
  log = "";

  private constructor(dir: string, proc: ChildProcess, socket: string) {
    this.dir = dir;
    this.proc = proc;
    this.socket = socket;
  }

  /**
   * remote starts a roostd with its remote listener on a loopback port, certificates made by
   * roostctl certs init: "sdk" an operator's, "viewer" a reader's, and "stranger" one of
   * another CA's.
   */
  static async remote(): Promise<Daemon> {
    const dir = tempDir();
    const certs = path.join(dir, "certs");
    const other = path.join(dir, "other");
    ctl(["certs", "init", certs, "--client", "sdk", "--client", "viewer:reader"]);
    ctl(["certs", "init", other, "--client", "stranger"]);
    const port = await freePort();
    const config = path.join(dir, "roostd.yaml");
    writeFileSync(
      config,
      `remote:\n  listen: 127.0.0.1:${port}\n  tls_cert: ${certs}/server.pem\n  tls_key: ${certs}/server-key.pem\n` +
        `  client_ca: ${certs}/ca.pem\n  clients:\n    - {common_name: sdk, role: operator}\n    - {common_name: viewer, role: reader}\n` +
        `    - {common_name: stranger, role: operator}\n`,
    );
    const d = await Daemon.start(dir, "--config", config);
    d.server = `127.0.0.1:${port}`;
    return d;
  }

  /** The options that reach the remote listener as one of remote()'s clients. */
  as(client: "sdk" | "viewer" | "stranger"): ConnectOptions {
    const [dir, file] = client === "stranger" ? ["other", "client"] : ["certs", client === "sdk" ? "client" : client];
    return {
      server: `https://${this.server}`,
      ca: path.join(this.dir, "certs", "ca.pem"),
      cert: path.join(this.dir, dir, `${file}.pem`),
      key: path.join(this.dir, dir, `${file}-key.pem`),
    };
  }

  static async start(dir = tempDir(), ...args: string[]): Promise<Daemon> {
    const bin = binDir();
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

function binDir(): string {
  return process.env.ROOST_BIN ?? path.join(repo, "bin");
}

function tempDir(): string {
  const dir = mkdtempSync(path.join(tmpdir(), "roost-sdk-ts-"));
  // Sessions' unprivileged uids pass through the state directory's parent, as /var/lib.
  chmodSync(dir, 0o711);
  return dir;
}

function ctl(args: string[]): void {
  const r = spawnSync(path.join(binDir(), "roostctl"), args, { encoding: "utf8" });
  if (r.status !== 0) {
    throw new Error(`roostctl ${args.join(" ")}: ${r.stderr}`);
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
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
