import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import type { Client } from "@connectrpc/connect";
import { FilesService, FileType, type FileInfo, type UploadTreeResponse } from "../gen/roost/v1/files_pb.js";
import { fromConnect, wrap } from "./errors.js";

export { FileType };
export type { FileInfo, UploadTreeResponse };

// One data message: well under roostd's default max_recv_message_bytes.
const CHUNK = 256 << 10;

function* chunks(data: Uint8Array): Generator<Uint8Array> {
  for (let i = 0; i < data.length; i += CHUNK) {
    yield data.subarray(i, i + CHUNK);
  }
}

/**
 * Files are the files of one session's workdir, live or ended (an ended session's are
 * read-only). Every path is relative to the workdir; roostd refuses one that is absolute,
 * climbs out with "..", or passes through a symlink.
 */
export class Files {
  constructor(
    private readonly rpc: Client<typeof FilesService>,
    private readonly session: string,
  ) {}

  /** write puts data at path (its directory must exist), replacing the file whole. */
  async write(path: string, data: string | Uint8Array, opts: { mode?: number; createOnly?: boolean } = {}): Promise<FileInfo> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    const session = this.session;
    async function* requests() {
      yield { part: { case: "header" as const, value: { session, path, mode: opts.mode ?? 0, createOnly: opts.createOnly ?? false } } };
      for (const c of chunks(bytes)) {
        yield { part: { case: "data" as const, value: c } };
      }
    }
    return (await wrap(() => this.rpc.writeFile(requests()))).info!;
  }

  /** readBytes is a regular file's bytes, from offset for length bytes (all by default). */
  async readBytes(path: string, opts: { offset?: number; length?: number } = {}): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    try {
      for await (const r of this.rpc.readFile({ session: this.session, path, offset: BigInt(opts.offset ?? 0), length: BigInt(opts.length ?? 0) })) {
        parts.push(r.data);
      }
    } catch (err) {
      throw fromConnect(err);
    }
    return Buffer.concat(parts);
  }

  /** read is a regular file's contents as UTF-8 text. */
  async read(path: string): Promise<string> {
    return Buffer.from(await this.readBytes(path)).toString("utf8");
  }

  /** list is a directory's entries (without "." and ".."), every page of them. */
  async list(path = "."): Promise<FileInfo[]> {
    const out: FileInfo[] = [];
    let pageToken = "";
    do {
      const res = await wrap(() => this.rpc.listDir({ session: this.session, path, pageToken }));
      out.push(...res.entries);
      pageToken = res.nextPageToken;
    } while (pageToken !== "");
    return out;
  }

  /** stat describes one entry; a symlink is described, not followed. */
  async stat(path: string): Promise<FileInfo> {
    return (await wrap(() => this.rpc.statFile({ session: this.session, path }))).info!;
  }

  /** exists says whether path names an entry. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (err) {
      if ((err as { name?: string }).name === "NotFoundError") {
        return false;
      }
      throw err;
    }
  }

  /** remove removes a file, a symlink, an empty directory, or with recursive a tree. */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await wrap(() => this.rpc.removeFile({ session: this.session, path, recursive: opts.recursive ?? false }));
  }

  /** mkdir makes a directory; with parents the missing ones above it, and an existing one is no error. */
  async mkdir(path: string, opts: { parents?: boolean; mode?: number } = {}): Promise<void> {
    await wrap(() => this.rpc.makeDir({ session: this.session, path, parents: opts.parents ?? false, mode: opts.mode ?? 0 }));
  }

  /**
   * upload copies a local directory's tree into the workdir's directory `to` (made when
   * missing), as a tar stream the system's tar writes.
   */
  async upload(localDir: string, to = "."): Promise<UploadTreeResponse> {
    const tar = spawn("tar", ["-C", localDir, "-cf", "-", "."], { stdio: ["ignore", "pipe", "pipe"] });
    const failed = tarExit(tar, `tar -C ${localDir} -c`);
    const session = this.session;
    async function* requests() {
      yield { part: { case: "header" as const, value: { session, path: to } } };
      for await (const c of tar.stdout!) {
        for (const part of chunks(c as Buffer)) {
          yield { part: { case: "data" as const, value: part } };
        }
      }
      // A tar that failed must not end the archive as if it were whole.
      await failed;
    }
    return wrap(() => this.rpc.uploadTree(requests()));
  }

  /**
   * unpack writes a tar archive's entries (its bytes, whole) into the workdir's directory
   * `to` (made when missing), as upload does a local directory's.
   */
  async unpack(archive: Uint8Array, to = "."): Promise<UploadTreeResponse> {
    const session = this.session;
    async function* requests() {
      yield { part: { case: "header" as const, value: { session, path: to } } };
      for (const c of chunks(archive)) {
        yield { part: { case: "data" as const, value: c } };
      }
    }
    return wrap(() => this.rpc.uploadTree(requests()));
  }

  /**
   * archive is the workdir's entry `from` (a directory's tree, or one file; the whole workdir
   * by default) as a tar stream, chunk by chunk as roostd writes it: directories, regular
   * files and symlinks, named relative to the directory (its own entry left out), or one
   * file by its base name. Its file data are bounded by resources.workdir_max_bytes.
   */
  async *archive(from = "."): AsyncGenerator<Uint8Array> {
    try {
      for await (const r of this.rpc.downloadTree({ session: this.session, path: from })) {
        yield r.data;
      }
    } catch (err) {
      throw fromConnect(err);
    }
  }

  /**
   * download copies the workdir's entry `from` (a directory's tree, or one file) into the
   * local directory `localDir` (made when missing), with the system's tar, which keeps
   * names that are absolute or climb out with ".." inside it, and its links from leading
   * out of it; neither owners nor (--no-same-permissions) setuid and setgid bits are kept.
   */
  async download(from: string, localDir: string): Promise<void> {
    mkdirSync(localDir, { recursive: true });
    const tar = spawn("tar", ["-C", localDir, "-xf", "-", "--no-same-owner", "--no-same-permissions"], { stdio: ["pipe", "ignore", "pipe"] });
    const done = tarExit(tar, `tar -C ${localDir} -x`);
    try {
      for await (const r of this.rpc.downloadTree({ session: this.session, path: from })) {
        if (!tar.stdin!.write(r.data)) {
          await new Promise((resolve) => tar.stdin!.once("drain", resolve));
        }
      }
    } catch (err) {
      tar.kill();
      await done.catch(() => {});
      throw fromConnect(err);
    }
    tar.stdin!.end();
    await done;
  }
}

function tarExit(tar: ReturnType<typeof spawn>, what: string): Promise<void> {
  let stderr = "";
  tar.stderr!.on("data", (b) => (stderr += b));
  return new Promise((resolve, reject) => {
    tar.once("error", (err) => reject(new Error(`${what}: ${err.message}`)));
    tar.once("close", (code) => (code === 0 ? resolve() : reject(new Error(`${what} exited with ${code}: ${stderr.trim()}`))));
  });
}
