// A reader of the tar archives roostd writes (POSIX ustar, with PAX extended headers), for
// the tests to check what an archive holds without the system's tar in between.

export interface TarEntry {
  name: string;
  /** The ustar typeflag: "0" a regular file, "5" a directory, "2" a symlink. */
  type: string;
  data: Uint8Array;
  linkname: string;
}

const BLOCK = 512;

/** readTar is the entries of a whole archive, in its order; it throws on a torn one. */
export function readTar(archive: Uint8Array): TarEntry[] {
  const buf = Buffer.from(archive.buffer, archive.byteOffset, archive.byteLength);
  const out: TarEntry[] = [];
  let pax: Record<string, string> = {};
  for (let at = 0; ; ) {
    if (at + BLOCK > buf.length) {
      throw new Error(`tar: the archive ends at ${buf.length} without its two zero blocks`);
    }
    const h = buf.subarray(at, at + BLOCK);
    if (h.every((b) => b === 0)) {
      return out;
    }
    const sum = octal(h, 148, 8);
    const computed = h.reduce((acc, b, i) => acc + (i >= 148 && i < 156 ? 0x20 : b), 0);
    if (sum !== computed) {
      throw new Error(`tar: the header at ${at} has checksum ${sum}, its bytes sum to ${computed}`);
    }
    const type = String.fromCharCode(h[156] || 0x30);
    let size = octal(h, 124, 12);
    if (pax.size !== undefined) {
      size = Number(pax.size);
    }
    const data = buf.subarray(at + BLOCK, at + BLOCK + size);
    if (data.length !== size) {
      throw new Error(`tar: the entry at ${at} holds ${size} bytes; the archive has ${data.length} left`);
    }
    at += BLOCK + Math.ceil(size / BLOCK) * BLOCK;
    if (type === "x") {
      pax = records(data);
      continue;
    }
    if (type === "g") {
      continue;
    }
    const prefix = str(h, 345, 155);
    const name = pax.path ?? (prefix ? `${prefix}/${str(h, 0, 100)}` : str(h, 0, 100));
    out.push({ name, type, data, linkname: pax.linkpath ?? str(h, 157, 100) });
    pax = {};
  }
}

function str(h: Buffer, off: number, len: number): string {
  const field = h.subarray(off, off + len);
  const end = field.indexOf(0);
  return field.subarray(0, end < 0 ? len : end).toString("utf8");
}

function octal(h: Buffer, off: number, len: number): number {
  const s = str(h, off, len).trim();
  return s === "" ? 0 : parseInt(s, 8);
}

// records parses a PAX extended header's "LEN key=value\n" records.
function records(data: Buffer): Record<string, string> {
  const out: Record<string, string> = {};
  for (let at = 0; at < data.length; ) {
    const sp = data.indexOf(0x20, at);
    const len = Number(data.subarray(at, sp).toString("ascii"));
    if (sp < 0 || !(len > 0)) {
      throw new Error(`tar: a PAX record at ${at} has no length`);
    }
    const rec = data.subarray(sp + 1, at + len - 1).toString("utf8");
    const eq = rec.indexOf("=");
    out[rec.slice(0, eq)] = rec.slice(eq + 1);
    at += len;
  }
  return out;
}
