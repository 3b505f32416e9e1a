// An OpenAI Agents SDK sandbox client over roost sessions: a SandboxAgent run with it runs its
// shell tool as the session's exec and its file tools on the session's workdir.
import * as path from "node:path";
import { applyDiff, type ApplyPatchOperation, type ApplyPatchResult, type Editor, type ToolOutputImage } from "@openai/agents";
import {
  Manifest,
  SandboxLifecycleError,
  SandboxPathResolutionError,
  SandboxArchiveError,
  SandboxUnsupportedFeatureError,
  normalizeSandboxClientCreateArgs,
  resolveSandboxArchiveLimits,
  type Entry,
  type ExecCommandArgs,
  type ListDirectoryArgs,
  type MaterializeEntryArgs,
  type ReadFileArgs,
  type SandboxArchiveLimits,
  type SandboxClient,
  type SandboxClientCreateArgs,
  type SandboxClientOptions,
  type SandboxDirectoryEntry,
  type SandboxExecResult,
  type SandboxSession,
  type SandboxSessionState,
  type ViewImageArgs,
  type WorkspaceArchiveData,
  type WorkspaceArchiveOptions,
} from "@openai/agents/sandbox";
import { FileType } from "./files.js";
import type { Roost, Session, SessionRecord } from "./roost.js";
import { DeadlineExceededError, NotFoundError } from "./errors.js";

/** The backend id the SDK records in a run's state for sessions of this client. */
export const ROOST_BACKEND_ID = "roost";

/** The SDK's default manifest root, which a roost session's workdir stands in for. */
const DEFAULT_ROOT = "/workspace";

/** What create stages: the options of sessions.create but the workdir's path, and the commands' time. */
export interface RoostSandboxClientOptions extends SandboxClientOptions {
  /** A capsule directory on roostd's host, or a pushed capsule's name@version. */
  capsule?: string;
  /** A name for the session, unique among the sessions not removed. */
  name?: string;
  /** An absolute directory for the session's workdir instead of one roostd makes. */
  workdir?: string;
  /** Labels kept in the session's record. */
  labels?: Record<string, string>;
  /** Raises the containment floor: "advisory", "scoped" or "sealed". */
  containment?: string;
  /** Lowers the capsule's deadline (milliseconds). */
  deadline?: number;
  /** Lowers the session's cgroup memory ceiling to this many bytes. */
  memoryBytes?: number;
  /** Each command's time in seconds (default 1800); past it the command is killed, exit code 124. */
  timeout?: number;
}

/** What the SDK keeps of a session of this client, and a run's state records of it. */
export interface RoostSandboxSessionState extends SandboxSessionState {
  /** The roost session's id. */
  sessionId: string;
  /** The seconds each command may take. */
  timeout: number;
  environment: Record<string, string>;
}

/**
 * RoostSandboxClient is the SDK's SandboxClient over roostd: create stages and launches a
 * session of the capsule its options name (the constructor's, over which a run's options
 * go), with the manifest's root standing for the session's workdir as its commands see it;
 * resume reconnects to a running session by id. The runner closes a session it created when
 * the run ends, which ends the roost session; its record, workdir, spend and trace stay on
 * roostd until it is removed (delete, or roostctl rm).
 */
export class RoostSandboxClient implements SandboxClient<RoostSandboxClientOptions, RoostSandboxSessionState> {
  readonly backendId = ROOST_BACKEND_ID;
  readonly supportsDefaultOptions = true;

  constructor(
    readonly roost: Roost,
    private readonly defaults: RoostSandboxClientOptions = {},
  ) {}

  async create(
    args?: SandboxClientCreateArgs<RoostSandboxClientOptions> | Manifest,
    manifestOptions?: RoostSandboxClientOptions,
  ): Promise<RoostSandboxSession> {
    const create = normalizeSandboxClientCreateArgs(args, manifestOptions);
    if (create.snapshot && create.snapshot.type !== "noop") {
      throw new SandboxUnsupportedFeatureError(`RoostSandboxClient: snapshot ${JSON.stringify(create.snapshot.type)}: a roost session keeps its workdir itself; use persistWorkspace and hydrateWorkspace`, {
        provider: ROOST_BACKEND_ID,
        feature: "snapshot",
      });
    }
    const opts = { ...this.defaults, ...create.options };
    if (!opts.capsule) {
      throw new TypeError("RoostSandboxClient.create: options.capsule is required (a capsule directory or name@version)");
    }
    const requested = create.manifest;
    checkManifest(requested);
    const s = await this.roost.sessions.create({
      capsule: opts.capsule,
      name: opts.name,
      workdir: opts.workdir,
      labels: opts.labels,
      containment: opts.containment,
      deadline: opts.deadline,
      memoryBytes: opts.memoryBytes,
    });
    const session = new RoostSandboxSession(s, {
      sessionId: s.id,
      manifest: rooted(requested, viewRoot(s.record)),
      timeout: opts.timeout ?? 1800,
      environment: await requested.resolveEnvironment(),
      workspaceReady: false,
    });
    if (s.state !== "running") {
      throw new SandboxLifecycleError(`RoostSandboxClient.create: session ${s.id} of ${opts.capsule} is ${s.state}, not running: ${s.record.detail}`, {
        provider: ROOST_BACKEND_ID,
        sessionId: s.id,
      });
    }
    try {
      await session.materialize(requested.entries);
    } catch (err) {
      await s.kill().catch(() => {});
      throw err;
    }
    session.state.workspaceReady = true;
    return session;
  }

  /** resume is the session state names, which must still be running. */
  async resume(state: RoostSandboxSessionState): Promise<RoostSandboxSession> {
    let s: Session;
    try {
      s = await this.roost.sessions.get(state.sessionId);
    } catch (err) {
      if (err instanceof NotFoundError) {
        throw new SandboxLifecycleError(`RoostSandboxClient.resume: session ${state.sessionId} is not on roostd (removed?)`, { provider: ROOST_BACKEND_ID, sessionId: state.sessionId });
      }
      throw err;
    }
    if (s.state !== "running") {
      throw new SandboxLifecycleError(`RoostSandboxClient.resume: session ${s.id} is ${s.state}, not running: an ended session's files are read with roostctl files, never resumed`, {
        provider: ROOST_BACKEND_ID,
        sessionId: s.id,
      });
    }
    return new RoostSandboxSession(s, { ...state, manifest: rooted(state.manifest, viewRoot(s.record)) });
  }

  /** delete removes the session from roostd, killing it first if it runs: its records and roost-made workdir go. */
  async delete(state: RoostSandboxSessionState): Promise<void> {
    try {
      await (await this.roost.sessions.get(state.sessionId)).remove({ force: true });
    } catch (err) {
      if (!(err instanceof NotFoundError)) {
        throw err;
      }
    }
  }

  /**
   * serializeSessionState is what a run's state keeps of a session besides its manifest:
   * its id and the commands' time. The environment is not kept (it may hold secrets); a
   * resumed session's commands get the session's own and the manifest's as the resuming
   * runner resolves it.
   */
  async serializeSessionState(state: RoostSandboxSessionState): Promise<Record<string, unknown>> {
    return { sessionId: state.sessionId, timeout: state.timeout };
  }

  async deserializeSessionState(raw: Record<string, unknown>): Promise<RoostSandboxSessionState> {
    const { sessionId, timeout, manifest } = raw;
    if (typeof sessionId !== "string" || sessionId === "") {
      throw new TypeError(`RoostSandboxClient.deserializeSessionState: sessionId is ${JSON.stringify(sessionId)}, not a session's id`);
    }
    if (typeof timeout !== "number" || !(timeout >= 0)) {
      throw new TypeError(`RoostSandboxClient.deserializeSessionState: timeout is ${JSON.stringify(timeout)}, not a number of seconds`);
    }
    const m = manifest instanceof Manifest ? manifest : new Manifest((manifest ?? {}) as ConstructorParameters<typeof Manifest>[0]);
    return { sessionId, timeout, manifest: m, environment: {}, workspaceReady: true };
  }
}

/**
 * RoostSandboxSession is one roost session as the SDK's SandboxSession: exec is the session's
 * exec (with exactly its containment), the file calls its files service, the workspace
 * archive a tar stream of its workdir. Paths are the manifest root's (the workdir as the
 * session's commands see it: the host's path, or /work in a sealed session) or relative to
 * it; one outside it is refused, as the files service cannot reach it.
 */
export class RoostSandboxSession implements SandboxSession<RoostSandboxSessionState> {
  private archiveLimits: SandboxArchiveLimits | null | undefined;

  constructor(
    /** The roost session. */
    readonly session: Session,
    readonly state: RoostSandboxSessionState,
  ) {}

  /** The workdir as the session's commands see it: the manifest's root. */
  get root(): string {
    return this.state.manifest.root;
  }

  supportsPty(): boolean {
    return false;
  }

  setArchiveLimits(limits?: SandboxArchiveLimits | null): void {
    this.archiveLimits = limits;
  }

  async running(): Promise<boolean> {
    try {
      return (await this.session.refresh()).state === "running";
    } catch (err) {
      if (err instanceof NotFoundError) {
        return false;
      }
      throw err;
    }
  }

  /**
   * exec runs args.cmd in the session by its shell (args.shell, else /bin/sh) with -c, in
   * args.workdir (the root by default). Commands do not run in a PTY; login is not honored
   * (every command is the capsule's environment, plus the manifest's). A command past the
   * session's timeout is killed and reported as exit code 124, as timeout(1) does.
   */
  async exec(args: ExecCommandArgs): Promise<SandboxExecResult> {
    if (args.tty) {
      throw new SandboxUnsupportedFeatureError("RoostSandboxSession: tty=true: roost runs a command without a terminal here; run it with tty=false", {
        provider: ROOST_BACKEND_ID,
        feature: "tty",
      });
    }
    this.noRunAs(args.runAs);
    const cwd = this.absolute(args.workdir ?? ".");
    const start = Date.now();
    const seconds = this.state.timeout;
    try {
      const r = await this.session.exec([args.shell ?? "/bin/sh", "-c", args.cmd], {
        cwd,
        env: this.state.environment,
        timeout: seconds > 0 ? seconds * 1000 : undefined,
      });
      // A refused command has no output but roostd's reason, which the model needs to see.
      const output = r.output === "" && r.exitCode !== 0 ? r.detail : r.output;
      return { output, stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode, wallTimeSeconds: (Date.now() - start) / 1000 };
    } catch (err) {
      if (err instanceof DeadlineExceededError) {
        const output = `the command ran past its ${seconds}s timeout and was killed`;
        return { output, stdout: "", stderr: output, exitCode: 124, wallTimeSeconds: (Date.now() - start) / 1000 };
      }
      throw err;
    }
  }

  /** execCommand is exec's result as the shell tool gives it the model. */
  async execCommand(args: ExecCommandArgs): Promise<string> {
    const r = await this.exec(args);
    const out = truncate(r.output, args.maxOutputTokens);
    const lines = [`Wall time: ${r.wallTimeSeconds.toFixed(4)} seconds`, `Process exited with code ${r.exitCode}`];
    if (out.originalTokenCount !== undefined) {
      lines.push(`Original token count: ${out.originalTokenCount}`);
    }
    lines.push("Output:", out.text);
    return lines.join("\n");
  }

  async readFile(args: ReadFileArgs): Promise<Uint8Array> {
    this.noRunAs(args.runAs);
    return this.session.files.readBytes(this.relative(args.path), { length: args.maxBytes });
  }

  async listDir(args: ListDirectoryArgs): Promise<SandboxDirectoryEntry[]> {
    this.noRunAs(args.runAs);
    const dir = this.relative(args.path);
    const base = this.absolute(dir);
    return (await this.session.files.list(dir)).map((e) => ({
      name: e.name,
      path: path.posix.join(base, e.name),
      type: e.type === FileType.REGULAR ? "file" : e.type === FileType.DIRECTORY ? "dir" : "other",
    }));
  }

  async pathExists(p: string, runAs?: string): Promise<boolean> {
    this.noRunAs(runAs);
    return this.session.files.exists(this.relative(p));
  }

  async directoryExists(p: string, runAs?: string): Promise<boolean> {
    this.noRunAs(runAs);
    try {
      return (await this.session.files.stat(this.relative(p))).type === FileType.DIRECTORY;
    } catch (err) {
      if (err instanceof NotFoundError) {
        return false;
      }
      throw err;
    }
  }

  async viewImage(args: ViewImageArgs): Promise<ToolOutputImage> {
    this.noRunAs(args.runAs);
    const bytes = await this.session.files.readBytes(this.relative(args.path));
    const mediaType = imageType(bytes);
    if (mediaType === undefined) {
      throw new TypeError(`${args.path} is not a supported image file (PNG, JPEG, GIF or WebP)`);
    }
    return { type: "image", image: { data: Uint8Array.from(bytes), mediaType } };
  }

  /** createEditor is the apply_patch tool's editor: V4A diffs applied to the workdir's files. */
  createEditor(runAs?: string): Editor {
    this.noRunAs(runAs);
    return new RoostEditor(this);
  }

  async materializeEntry(args: MaterializeEntryArgs): Promise<void> {
    this.noRunAs(args.runAs);
    checkEntries({ [args.path]: args.entry });
    await this.materialize({ [args.path]: args.entry });
  }

  async applyManifest(manifest: Manifest, runAs?: string): Promise<void> {
    this.noRunAs(runAs);
    checkManifest(manifest);
    await this.materialize(manifest.entries);
  }

  /** persistWorkspace is a tar archive of the whole workdir. */
  async persistWorkspace(): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    for await (const c of this.session.files.archive()) {
      parts.push(c);
    }
    return Buffer.concat(parts);
  }

  /** hydrateWorkspace unpacks a tar archive (a string's characters taken as its bytes) into the workdir. */
  async hydrateWorkspace(data: WorkspaceArchiveData, options: WorkspaceArchiveOptions = {}): Promise<void> {
    const bytes = typeof data === "string" ? Buffer.from(data, "latin1") : data instanceof Uint8Array ? data : new Uint8Array(data);
    const limits = resolveSandboxArchiveLimits(options.archiveLimits !== undefined ? options.archiveLimits : this.archiveLimits);
    if (limits?.maxInputBytes != null && bytes.byteLength > limits.maxInputBytes) {
      throw new SandboxArchiveError(`RoostSandboxSession.hydrateWorkspace: the archive is ${bytes.byteLength} bytes, over its limit of ${limits.maxInputBytes}`, {
        provider: ROOST_BACKEND_ID,
        bytes: bytes.byteLength,
        maxInputBytes: limits.maxInputBytes,
      });
    }
    await this.session.files.unpack(bytes, ".");
  }

  /** close ends the roost session (SIGKILL to its processes); its record stays on roostd. */
  async close(): Promise<void> {
    try {
      const rec = await this.session.refresh();
      if (rec.state !== "exited") {
        await this.session.kill();
      }
    } catch (err) {
      if (!(err instanceof NotFoundError)) {
        throw err;
      }
    }
  }

  /** @internal materialize writes manifest entries (checked by checkEntries) beneath the root. */
  async materialize(entries: Record<string, Entry>, under = "."): Promise<void> {
    for (const [name, entry] of Object.entries(entries)) {
      const rel = this.relative(path.posix.join(under, name));
      if (entry.type === "dir") {
        await this.session.files.mkdir(rel, { parents: true });
        await this.materialize(entry.children ?? {}, rel);
      } else if (entry.type === "file") {
        await this.mkdirFor(rel);
        await this.session.files.write(rel, entry.content);
      }
    }
  }

  /** @internal mkdirFor makes the directories above a workdir-relative path. */
  async mkdirFor(rel: string): Promise<void> {
    const dir = path.posix.dirname(rel);
    if (dir !== ".") {
      await this.session.files.mkdir(dir, { parents: true });
    }
  }

  /** @internal relative is p as the files service takes it: relative to the workdir. */
  relative(p: string): string {
    const abs = path.posix.resolve(this.root, p);
    const rel = path.posix.relative(this.root, abs);
    if (rel === ".." || rel.startsWith("../")) {
      throw new SandboxPathResolutionError(`${p} is outside the session's workdir ${this.root}`, { provider: ROOST_BACKEND_ID, path: p, root: this.root });
    }
    return rel === "" ? "." : rel;
  }

  private absolute(p: string): string {
    return path.posix.join(this.root, this.relative(p));
  }

  private noRunAs(runAs: string | undefined): void {
    if (runAs) {
      throw new SandboxUnsupportedFeatureError(`RoostSandboxSession: runAs ${JSON.stringify(runAs)}: every command and file of a roost session is its own uid's`, {
        provider: ROOST_BACKEND_ID,
        feature: "runAs",
      });
    }
  }
}

/** RoostEditor applies the apply_patch tool's operations to a session's workdir. */
class RoostEditor implements Editor {
  constructor(private readonly s: RoostSandboxSession) {}

  async createFile(op: Extract<ApplyPatchOperation, { type: "create_file" }>): Promise<ApplyPatchResult> {
    const rel = this.s.relative(op.path);
    await this.s.mkdirFor(rel);
    await this.s.session.files.write(rel, applyDiff("", op.diff, "create"));
    return { output: `Created ${op.path}` };
  }

  async updateFile(op: Extract<ApplyPatchOperation, { type: "update_file" }>): Promise<ApplyPatchResult> {
    const rel = this.s.relative(op.path);
    const next = applyDiff(await this.s.session.files.read(rel), op.diff);
    const to = op.moveTo ? this.s.relative(op.moveTo) : rel;
    await this.s.mkdirFor(to);
    await this.s.session.files.write(to, next);
    if (to !== rel) {
      await this.s.session.files.remove(rel);
      return { output: `Updated ${op.path} and moved it to ${op.moveTo}` };
    }
    return { output: `Updated ${op.path}` };
  }

  async deleteFile(op: Extract<ApplyPatchOperation, { type: "delete_file" }>): Promise<ApplyPatchResult> {
    await this.s.session.files.remove(this.s.relative(op.path));
    return { output: `Deleted ${op.path}` };
  }
}

// viewRoot is where the session's commands see its workdir (roostd says: /work in a sealed
// root); a roostd from before it told this has only the host's path.
function viewRoot(rec: SessionRecord): string {
  return rec.sessionWorkdir || rec.workdir;
}

// checkManifest refuses what a roost session's manifest cannot hold: its users, groups and
// grants are the capsule's, and its root is the session's workdir.
function checkManifest(m: Manifest): void {
  const refuse = (feature: string, what: string) => {
    throw new SandboxUnsupportedFeatureError(`RoostSandboxClient: the manifest's ${what}: a roost session's are its capsule's`, { provider: ROOST_BACKEND_ID, feature });
  };
  if (m.users.length > 0) {
    refuse("users", `users (${m.users.map((u) => u.name).join(", ")})`);
  }
  if (m.groups.length > 0) {
    refuse("groups", `groups (${m.groups.map((g) => g.name).join(", ")})`);
  }
  if (m.extraPathGrants.length > 0) {
    refuse("extraPathGrants", "extraPathGrants");
  }
  checkEntries(m.entries);
}

// checkEntries refuses entries but files and directories: the rest (local files, git
// repositories, mounts) belong in the capsule, which roost stages and contains.
function checkEntries(entries: Record<string, Entry>, under = ""): void {
  for (const [name, entry] of Object.entries(entries)) {
    const p = under === "" ? name : `${under}/${name}`;
    if (entry.type === "dir") {
      checkEntries(entry.children ?? {}, p);
    } else if (entry.type !== "file") {
      throw new SandboxUnsupportedFeatureError(`RoostSandboxClient: manifest entry ${p} is a ${entry.type}: a roost session's manifest holds files and directories (put the rest in its capsule)`, {
        provider: ROOST_BACKEND_ID,
        feature: entry.type,
        path: p,
      });
    }
  }
}

// rooted is m with the root replaced by the session's workdir: a manifest naming another
// root than the default cannot have it.
function rooted(m: Manifest, root: string): Manifest {
  if (m.root !== DEFAULT_ROOT && m.root !== root) {
    throw new SandboxUnsupportedFeatureError(`RoostSandboxClient: the manifest's root ${m.root}: a roost session's workspace is its workdir, ${root}; leave root unset`, {
      provider: ROOST_BACKEND_ID,
      feature: "root",
    });
  }
  return new Manifest({ version: m.version, root, entries: m.entries, environment: m.environment, remoteMountCommandAllowlist: m.remoteMountCommandAllowlist });
}

// truncate keeps output within maxTokens (four bytes a token), its head and tail, as the
// SDK's own sandboxes do.
function truncate(output: string, maxTokens: number | undefined): { text: string; originalTokenCount?: number } {
  const bytes = Buffer.from(output, "utf8");
  if (maxTokens === undefined || bytes.length <= maxTokens * 4) {
    return { text: output };
  }
  const keep = Math.max(0, maxTokens * 4);
  const head = bytes.subarray(0, Math.floor(keep / 2)).toString("utf8");
  const tail = bytes.subarray(bytes.length - Math.ceil(keep / 2)).toString("utf8");
  const cut = Math.ceil((bytes.length - keep) / 4);
  return { text: `${head}…${cut} tokens truncated…${tail}`, originalTokenCount: Math.ceil(bytes.length / 4) };
}

// imageType is an image's media type from its first bytes.
function imageType(b: Uint8Array): string | undefined {
  const starts = (...sig: number[]) => sig.every((v, i) => b[i] === v);
  if (starts(0x89, 0x50, 0x4e, 0x47)) {
    return "image/png";
  }
  if (starts(0xff, 0xd8, 0xff)) {
    return "image/jpeg";
  }
  if (starts(0x47, 0x49, 0x46, 0x38)) {
    return "image/gif";
  }
  if (starts(0x52, 0x49, 0x46, 0x46) && b[8] === 0x57 && b[9] === 0x45 && b[10] === 0x42 && b[11] === 0x50) {
    return "image/webp";
  }
  return undefined;
}
