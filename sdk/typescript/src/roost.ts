import { existsSync, realpathSync } from "node:fs";
import * as path from "node:path";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, createClient, type Client } from "@connectrpc/connect";
import { SessionService, type Session as SessionRecord, type ExecInfo, ExecRequestSchema } from "../gen/roost/v1/session_pb.js";
import { SystemService, type VersionResponse } from "../gen/roost/v1/system_pb.js";
import { ArtifactService, type Artifact } from "../gen/roost/v1/artifact_pb.js";
import { FilesService } from "../gen/roost/v1/files_pb.js";
import { Files, type UploadTreeResponse } from "./files.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { fromConnect, wrap, DeadlineExceededError, FailedPreconditionError, RoostError } from "./errors.js";
import { transportFor, type ConnectOptions } from "./transport.js";

export type { SessionRecord, ExecInfo };

/** What roostd is asked to stage: see sessions.create. */
export interface CreateOptions {
  /**
   * A capsule directory (or its capsule.yaml) on roostd's host, or a pushed capsule's
   * name@version. Over the unix socket a relative path is taken from this process's working
   * directory.
   */
  capsule: string;
  /** A name for the session, unique among the sessions not removed. */
  name?: string;
  /** An absolute directory for the session's workdir instead of one roostd makes. */
  workdir?: string;
  /** Lowers the capsule's deadline (milliseconds); it can never raise it. */
  deadline?: number;
  /** Raises the containment floor: "advisory", "scoped" or "sealed". */
  containment?: string;
  /** Lowers the session's cgroup memory ceiling to this many bytes. */
  memoryBytes?: number;
  /** Labels kept in the session's record, for sessions.list to select by. */
  labels?: Record<string, string>;
}

export interface ExecOptions {
  /** The command's time in milliseconds; past it roostd kills it and exec throws DeadlineExceededError. */
  timeout?: number;
  /** More environment over the session's own. */
  env?: Record<string, string>;
  /** The working directory; the session's workdir when unset. */
  cwd?: string;
  /** What the command reads on stdin; empty when unset. */
  stdin?: string | Uint8Array;
  /**
   * Run it in the background: exec returns an ExecHandle once it has started, and the
   * command runs on, its output kept in the session's records. It reads no stdin, and
   * timeout does not apply.
   */
  background?: boolean;
  /** Called with the command's stdout as it arrives, chunk by chunk, before exec returns. */
  onStdout?: (data: string) => void;
  /** Called with the command's stderr as it arrives. */
  onStderr?: (data: string) => void;
}

/** How ExecHandle.wait reads a background exec's output. */
export interface AttachOptions {
  /** Called with its stdout as the records give it, then as it is written. */
  onStdout?: (data: string) => void;
  /** Called with its stderr, likewise. */
  onStderr?: (data: string) => void;
  /**
   * Resume: only stdout from this byte offset on (the bytes of stdout already received, as
   * Buffer.byteLength counts them); the result's stdout then begins there too.
   */
  stdoutOffset?: number;
  /** Resume: only stderr from this byte offset on. */
  stderrOffset?: number;
}

export interface ExecResult {
  /** The command's exit code; 128+N when signal N ended it. */
  exitCode: number;
  stdout: string;
  stderr: string;
  /** stdout and stderr as they arrived, interleaved. */
  output: string;
  /** In words: "exited with code 3", "refused by shell.allow: ...". */
  detail: string;
  /** The exec's id in the session's events and trace; empty when it never started. */
  execId: string;
}

/**
 * Roost is one connection to roostd. connect() opens nothing yet: the first call does, and
 * fails with UnavailableError when roostd cannot be reached.
 */
export class Roost {
  readonly sessions: Sessions;
  readonly artifacts: Artifacts;
  /** @internal */ readonly rpc: {
    sessions: Client<typeof SessionService>;
    system: Client<typeof SystemService>;
    artifacts: Client<typeof ArtifactService>;
    files: Client<typeof FilesService>;
  };
  /** @internal */ readonly local: boolean;
  private readonly closeTransport: () => void;

  private constructor(opts: ConnectOptions) {
    const { transport, close, local } = transportFor(opts);
    this.closeTransport = close;
    this.local = local;
    this.rpc = {
      sessions: createClient(SessionService, transport),
      system: createClient(SystemService, transport),
      artifacts: createClient(ArtifactService, transport),
      files: createClient(FilesService, transport),
    };
    this.sessions = new Sessions(this);
    this.artifacts = new Artifacts(this);
  }

  static connect(opts: ConnectOptions = {}): Roost {
    return new Roost(opts);
  }

  /** roostd's version and API version. */
  async version(): Promise<VersionResponse> {
    return wrap(() => this.rpc.system.version({}));
  }

  /** close ends the connection; calls in flight fail. */
  close(): void {
    this.closeTransport();
  }

  /** @internal A capsule argument as roostd is told it (see CreateOptions.capsule). */
  capsuleRef(capsule: string): string {
    if (!capsule) {
      throw new TypeError("sessions.create: capsule is required (a directory or name@version)");
    }
    if (!this.local || (capsule.includes("@") && !capsule.includes("/") && !existsSync(capsule))) {
      return capsule;
    }
    // roostd has another working directory; links of this user's own on the way are
    // resolved here, as roostctl does, since roostd follows only root's.
    const abs = path.resolve(capsule);
    try {
      return realpathSync(abs);
    } catch {
      return abs;
    }
  }
}

export class Sessions {
  constructor(private readonly roost: Roost) {}

  /**
   * create stages the capsule and launches it: the session returned is running (or, when
   * its program could not start, ended: see state and detail).
   */
  async create(opts: CreateOptions): Promise<Session> {
    const capsule = this.roost.capsuleRef(opts.capsule);
    const rpc = this.roost.rpc.sessions;
    const staged = await wrap(() =>
      rpc.stage({
        capsule,
        name: opts.name ?? "",
        workdir: opts.workdir ?? "",
        containment: opts.containment ?? "",
        memoryBytes: BigInt(opts.memoryBytes ?? 0),
        deadline: opts.deadline === undefined ? undefined : durationFromMs(opts.deadline),
        labels: opts.labels ?? {},
      }),
    );
    const id = staged.session!.id;
    const launched = await wrap(() => rpc.launch({ id }));
    return new Session(this.roost, launched.session!);
  }

  /** get is one session by id, unique id prefix or name. */
  async get(id: string): Promise<Session> {
    const res = await wrap(() => this.roost.rpc.sessions.get({ id }));
    return new Session(this.roost, res.session!);
  }

  /**
   * list is the staged and live sessions, or every one with all; with labels only those
   * whose labels hold every one given (a key given "" must be there, with any value).
   */
  async list(opts: { all?: boolean; labels?: Record<string, string> } = {}): Promise<Session[]> {
    const label = Object.entries(opts.labels ?? {}).map(([k, v]) => (v === "" ? k : `${k}=${v}`));
    const res = await wrap(() => this.roost.rpc.sessions.list({ all: opts.all ?? false, label }));
    return res.sessions.map((s) => new Session(this.roost, s));
  }
}

export class Artifacts {
  constructor(private readonly roost: Roost) {}

  /** push stores a capsule directory on roostd's host under its manifest's name@version. */
  async push(dir: string): Promise<Artifact> {
    const p = this.roost.capsuleRef(dir);
    const res = await wrap(() => this.roost.rpc.artifacts.push({ path: p }));
    return res.artifact!;
  }

  async list(): Promise<Artifact[]> {
    return (await wrap(() => this.roost.rpc.artifacts.listArtifacts({}))).artifacts;
  }

  async remove(ref: string): Promise<Artifact> {
    return (await wrap(() => this.roost.rpc.artifacts.removeArtifact({ ref }))).artifact!;
  }
}

/**
 * Session is one session of roostd's. `record` is its last record seen (the message
 * `roostctl inspect --json` prints); the methods that change it update it.
 */
export class Session {
  /** The files of the session's workdir. */
  readonly files: Files;

  constructor(
    private readonly roost: Roost,
    public record: SessionRecord,
  ) {
    this.files = new Files(roost.rpc.files, record.id);
  }

  get id(): string {
    return this.record.id;
  }
  get name(): string {
    return this.record.name;
  }
  /** staged | launching | running | paused | stopping | exited */
  get state(): string {
    return this.record.state;
  }
  /** The labels given at stage. */
  get labels(): Record<string, string> {
    return this.record.labels;
  }
  /** The program's exit code once it has ended; undefined before. */
  get exitCode(): number | undefined {
    return this.record.exitCode;
  }

  private get rpc() {
    return this.roost.rpc.sessions;
  }

  /** refresh reads the session's record again. */
  async refresh(): Promise<Session> {
    this.record = (await wrap(() => this.rpc.get({ id: this.id }))).session!;
    return this;
  }

  /**
   * exec runs a command in the running session, with exactly its containment. A string is
   * run by /bin/sh -c (which the capsule's exec allowlist must let run); an array is argv.
   * A non-zero exit is a result, not an error: errors are roostd's refusals (the session
   * missing or not running) and the timeout.
   */
  exec(cmd: string | string[], opts: ExecOptions & { background: true }): Promise<ExecHandle>;
  exec(cmd: string | string[], opts?: ExecOptions & { background?: false }): Promise<ExecResult>;
  async exec(cmd: string | string[], opts: ExecOptions = {}): Promise<ExecResult | ExecHandle> {
    const argv = typeof cmd === "string" ? ["/bin/sh", "-c", cmd] : cmd;
    if (argv.length === 0) {
      throw new TypeError("exec: the command is empty");
    }
    const env = Object.entries(opts.env ?? {}).map(([k, v]) => `${k}=${v}`);
    const stdin = typeof opts.stdin === "string" ? new TextEncoder().encode(opts.stdin) : opts.stdin;
    const id = this.id;
    async function* requests(): AsyncIterable<MessageInitShape<typeof ExecRequestSchema>> {
      yield { msg: { case: "start", value: { id, command: argv, env, cwd: opts.cwd ?? "", stdin: stdin !== undefined, detach: opts.background ?? false } } };
      if (stdin !== undefined && stdin.length > 0) {
        yield { msg: { case: "stdin", value: stdin } };
      }
      // The end of the requests closes the command's stdin.
    }
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    const both: Uint8Array[] = [];
    const res: ExecResult = { exitCode: -1, stdout: "", stderr: "", output: "", detail: "", execId: "" };
    const onStdout = streamed(opts.onStdout);
    const onStderr = streamed(opts.onStderr);
    let exited = false;
    const started = Date.now();
    try {
      for await (const r of this.rpc.exec(requests(), { timeoutMs: opts.timeout })) {
        switch (r.msg.case) {
          case "started":
            res.execId = r.msg.value.execId;
            break;
          case "stdout":
            out.push(r.msg.value);
            both.push(r.msg.value);
            onStdout(r.msg.value);
            break;
          case "stderr":
            err.push(r.msg.value);
            both.push(r.msg.value);
            onStderr(r.msg.value);
            break;
          case "exit":
            res.exitCode = r.msg.value.exitCode;
            res.detail = r.msg.value.detail;
            exited = true;
            break;
        }
      }
    } catch (e) {
      const err = fromConnect(e);
      // roostd ends a call past its grpc-timeout by resetting the stream (CANCEL), which may
      // come before this client's own deadline fires: that is the timeout too.
      if (opts.timeout !== undefined && err.code === Code.Canceled && Date.now() - started >= opts.timeout) {
        throw new DeadlineExceededError(`exec in ${id}: the command ran past its ${opts.timeout}ms timeout`, Code.DeadlineExceeded);
      }
      throw err;
    }
    if (opts.background && (res.execId !== "" || exited)) {
      // A command that could not start (refused, not found) is a handle already ended.
      return new ExecHandle(this.roost, id, res.execId, exited ? res : undefined);
    }
    if (!exited) {
      throw new RoostError(`exec in ${id}: the stream ended without the command's exit`, Code.Unknown);
    }
    res.stdout = text(out);
    res.stderr = text(err);
    res.output = text(both);
    return res;
  }

  /**
   * attachExec is a handle on one of the session's background execs by its id (an
   * ExecHandle's execId, one of execs(), or one another client started): its wait re-attaches
   * to the command's output, from an offset when given, and follows it to its end.
   */
  attachExec(execId: string): ExecHandle {
    if (!execId) {
      throw new TypeError("attachExec: the exec's id is required");
    }
    return new ExecHandle(this.roost, this.id, execId);
  }

  /** execs is the session's background execs, live and ended, oldest first. */
  async execs(): Promise<ExecInfo[]> {
    return (await wrap(() => this.rpc.listExecs({ id: this.id }))).execs;
  }

  /**
   * upload copies a local directory's tree into the workdir's directory `to` (made when
   * missing); see Files.upload.
   */
  async upload(localDir: string, to = "."): Promise<UploadTreeResponse> {
    return this.files.upload(localDir, to);
  }

  /** download copies the workdir's entry `from` into the local directory `localDir`; see Files.download. */
  async download(from: string, localDir: string): Promise<void> {
    return this.files.download(from, localDir);
  }

  /** wait blocks until the session has ended and returns its final record. */
  async wait(): Promise<SessionRecord> {
    this.record = (await wrap(() => this.rpc.wait({ id: this.id }))).session!;
    return this.record;
  }

  /** kill sends a signal (SIGKILL by default) to every process of the session. */
  async kill(signal = ""): Promise<SessionRecord> {
    this.record = (await wrap(() => this.rpc.kill({ id: this.id, signal }))).session!;
    return this.record;
  }

  /** stop sends SIGTERM, then SIGKILL after grace milliseconds (10s by default). */
  async stop(opts: { grace?: number } = {}): Promise<SessionRecord> {
    const grace = opts.grace === undefined ? undefined : durationFromMs(opts.grace);
    this.record = (await wrap(() => this.rpc.stop({ id: this.id, grace, reason: "" }))).session!;
    return this.record;
  }

  async pause(): Promise<SessionRecord> {
    this.record = (await wrap(() => this.rpc.pause({ id: this.id }))).session!;
    return this.record;
  }

  async resume(): Promise<SessionRecord> {
    this.record = (await wrap(() => this.rpc.resume({ id: this.id }))).session!;
    return this.record;
  }

  /**
   * remove forgets an ended session and deletes its records, home and roost-made workdir;
   * with force a live one is killed first.
   */
  async remove(opts: { force?: boolean } = {}): Promise<void> {
    await wrap(() => this.rpc.remove({ id: this.id, force: opts.force ?? false }));
  }

  /** logs is what the session's program has written so far. */
  async logs(): Promise<{ stdout: string; stderr: string }> {
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    try {
      for await (const r of this.rpc.logs({ id: this.id })) {
        (r.stream === "stderr" ? err : out).push(r.data);
      }
    } catch (e) {
      throw fromConnect(e);
    }
    return { stdout: text(out), stderr: text(err) };
  }
}

/**
 * ExecHandle is a command exec'd in the background (exec's background option): it runs on
 * whether or not anyone waits for it.
 */
export class ExecHandle {
  constructor(
    private readonly roost: Roost,
    /** The session it runs in. */
    readonly sessionId: string,
    /** Its id in the session's events, trace and records; empty when it never started. */
    readonly execId: string,
    private readonly refused?: ExecResult,
  ) {}

  /**
   * wait blocks until the command has ended and returns what exec returns: its exit and all
   * its output the records kept (from the offsets given on). It attaches to the command's
   * output, so onStdout and onStderr see it as it is written.
   */
  async wait(opts: AttachOptions = {}): Promise<ExecResult> {
    if (this.refused) {
      return this.refused;
    }
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    const both: Uint8Array[] = [];
    const res: ExecResult = { exitCode: -1, stdout: "", stderr: "", output: "", detail: "", execId: this.execId };
    const onStdout = streamed(opts.onStdout);
    const onStderr = streamed(opts.onStderr);
    let exited = false;
    const req = {
      id: this.sessionId,
      execId: this.execId,
      follow: true,
      stdoutOffset: BigInt(opts.stdoutOffset ?? 0),
      stderrOffset: BigInt(opts.stderrOffset ?? 0),
    };
    try {
      for await (const r of this.roost.rpc.sessions.attachExec(req)) {
        if (r.msg.case === "output") {
          const stderr = r.msg.value.stream === "stderr";
          (stderr ? err : out).push(r.msg.value.data);
          both.push(r.msg.value.data);
          (stderr ? onStderr : onStdout)(r.msg.value.data);
        } else if (r.msg.case === "exit") {
          res.exitCode = r.msg.value.exitCode;
          res.detail = r.msg.value.detail;
          exited = true;
        }
      }
    } catch (e) {
      throw fromConnect(e);
    }
    if (!exited) {
      throw new RoostError(`exec ${this.execId} in ${this.sessionId}: the stream ended without the command's exit`, Code.Unknown);
    }
    res.stdout = text(out);
    res.stderr = text(err);
    res.output = text(both);
    return res;
  }

  /** kill sends a signal (SIGKILL by default) to the command and all it started. */
  async kill(signal = ""): Promise<ExecInfo> {
    if (this.refused) {
      throw new FailedPreconditionError(`exec in ${this.sessionId} never started: ${this.refused.detail}`, Code.FailedPrecondition);
    }
    return (await wrap(() => this.roost.rpc.sessions.killExec({ id: this.sessionId, execId: this.execId, signal }))).exec!;
  }
}

/**
 * streamed is a callback of text over one stream's bytes: a character split between two
 * chunks is passed whole, with the second.
 */
function streamed(fn: ((data: string) => void) | undefined): (chunk: Uint8Array) => void {
  if (!fn) {
    return () => {};
  }
  const decoder = new TextDecoder("utf-8");
  return (chunk) => {
    const data = decoder.decode(chunk, { stream: true });
    if (data !== "") {
      fn(data);
    }
  };
}

function text(chunks: Uint8Array[]): string {
  return Buffer.concat(chunks).toString("utf8");
}
