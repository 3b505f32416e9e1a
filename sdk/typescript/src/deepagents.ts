// A deepagents sandbox backend over a roost session: a deepagents agent given it runs its
// execute tool as the session's exec, and its file tools on the session's workdir.
import * as path from "node:path";
import { BaseSandbox, type ExecuteResponse, type FileDownloadResponse, type FileUploadResponse } from "deepagents";
import type { Session } from "./roost.js";
import { DeadlineExceededError, NotFoundError, PermissionDeniedError } from "./errors.js";

/** The most characters of a command's output execute returns (the model reads it all). */
export const DEFAULT_MAX_OUTPUT = 100_000;

export interface RoostSandboxOptions {
  /** Each command's time in seconds, unless execute is given another (default 1800). */
  timeout?: number;
  /** Output past this many characters is cut and reported truncated (default DEFAULT_MAX_OUTPUT). */
  maxOutput?: number;
}

/**
 * RoostSandbox is deepagents' BaseSandbox over a running roost session: execute is the
 * session's exec (by /bin/sh -c, so the capsule's shell.allow must let /bin/sh run, with
 * exactly the session's containment); uploadFiles and downloadFiles are its files service.
 * Paths are absolute ones beneath workdir, the workdir as the session's commands see it, or
 * relative to it; the model is best told workdir, which is also every command's working
 * directory, so execute and the file tools name the same files in every containment class.
 */
export class RoostSandbox extends BaseSandbox {
  private readonly timeout: number;
  private readonly maxOutput: number;

  constructor(
    readonly session: Session,
    opts: RoostSandboxOptions = {},
  ) {
    super();
    this.timeout = opts.timeout ?? 1800;
    this.maxOutput = opts.maxOutput ?? DEFAULT_MAX_OUTPUT;
  }

  /** The session's id. */
  get id(): string {
    return this.session.id;
  }

  /**
   * The session's workdir as its commands see it (/work in a sealed session, the host's path
   * otherwise): the directory the agent's paths are best given in, and every command's
   * working directory. A roostd from before it told this tells the host's path.
   */
  get workdir(): string {
    return this.session.record.sessionWorkdir || this.session.record.workdir;
  }

  /**
   * execute runs command in the session. A command past its timeout (seconds) is killed and
   * reported as exit code 124, as timeout(1) does; roostd's refusals (the session ended) throw.
   */
  async execute(command: string, options: { timeout?: number } = {}): Promise<ExecuteResponse> {
    const seconds = options.timeout ?? this.timeout;
    try {
      const r = await this.session.exec(command, { timeout: seconds > 0 ? seconds * 1000 : undefined });
      const truncated = r.output.length > this.maxOutput;
      // A refused command has no output but roostd's reason, which the model needs to see.
      const output = r.output === "" && r.exitCode !== 0 ? r.detail : r.output;
      return { output: truncated ? output.slice(0, this.maxOutput) : output, exitCode: r.exitCode, truncated };
    } catch (err) {
      if (err instanceof DeadlineExceededError) {
        return { output: `the command ran past its ${seconds}s timeout and was killed`, exitCode: 124, truncated: false };
      }
      throw err;
    }
  }

  async uploadFiles(files: Array<[string, Uint8Array]>): Promise<FileUploadResponse[]> {
    const out: FileUploadResponse[] = [];
    for (const [p, content] of files) {
      const rel = this.relative(p);
      if (rel === undefined) {
        out.push({ path: p, error: "invalid_path" });
        continue;
      }
      try {
        const dir = path.posix.dirname(rel);
        if (dir !== ".") {
          await this.session.files.mkdir(dir, { parents: true });
        }
        await this.session.files.write(rel, content);
        out.push({ path: p, error: null });
      } catch (err) {
        out.push({ path: p, error: fileError(err) });
      }
    }
    return out;
  }

  async downloadFiles(paths: string[]): Promise<FileDownloadResponse[]> {
    const out: FileDownloadResponse[] = [];
    for (const p of paths) {
      const rel = this.relative(p);
      if (rel === undefined) {
        out.push({ path: p, content: null, error: "invalid_path" });
        continue;
      }
      try {
        out.push({ path: p, content: await this.session.files.readBytes(rel), error: null });
      } catch (err) {
        out.push({ path: p, content: null, error: fileError(err) });
      }
    }
    return out;
  }

  // relative is p as the files service takes it, relative to the workdir; undefined for an
  // absolute path outside it, which the files service cannot reach.
  private relative(p: string): string | undefined {
    if (!path.posix.isAbsolute(p)) {
      return path.posix.normalize(p);
    }
    const rel = path.posix.relative(this.workdir, p);
    return rel === "" || rel === ".." || rel.startsWith("../") ? undefined : rel;
  }
}

function fileError(err: unknown): FileUploadResponse["error"] {
  if (err instanceof NotFoundError) {
    return "file_not_found";
  }
  if (err instanceof PermissionDeniedError) {
    return "permission_denied";
  }
  // deepagents has no code for the rest (roostd's refusal of a path, a session ended).
  return "invalid_path";
}
