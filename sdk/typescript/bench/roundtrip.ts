// A client of roostd that stays connected, for bench/sdk.sh: each line on stdin is one
// measurement through @roost/sdk, its result one line on stdout, timed by this process's own
// clock (a connection's setup is not in it: the first call made it).
//
//   rt          sessions.create, exec(["true"]), remove({ force: true }) of --capsule:
//               "<total us> <session id> <create us> <exec us> <remove us>"
//   files BYTES files.write then files.readBytes of BYTES bytes in one session of --capsule
//               (made at the first such line): "<write us> <read us>"
//
// A failure is "error: <message>" and the next line is read. Run from sdk/typescript after
// npm run build: node dist/bench/roundtrip.js --socket PATH --capsule REF, or with --server
// HOST:PORT --ca FILE --cert FILE --key FILE for roostd's mTLS listener.
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import { Roost, type Session } from "../src/index.js";

const { values: args } = parseArgs({
  options: {
    socket: { type: "string" },
    server: { type: "string" },
    ca: { type: "string" },
    cert: { type: "string" },
    key: { type: "string" },
    capsule: { type: "string" },
  },
});
if (!args.capsule || (!args.socket && !args.server)) {
  process.stderr.write("usage: roundtrip.js (--socket PATH | --server HOST:PORT --ca F --cert F --key F) --capsule REF\n");
  process.exit(2);
}
const capsule = args.capsule;
const roost = Roost.connect(args.server ? { server: args.server, ca: args.ca, cert: args.cert, key: args.key } : { socket: args.socket });

function us(since: bigint): number {
  return Number((process.hrtime.bigint() - since) / 1000n);
}

async function roundTrip(): Promise<string> {
  const t0 = process.hrtime.bigint();
  const s = await roost.sessions.create({ capsule });
  const created = us(t0);
  if (s.state !== "running") {
    throw new Error(`session ${s.id} is ${s.state} after create: ${s.record.detail}`);
  }
  const t1 = process.hrtime.bigint();
  const r = await s.exec(["true"]);
  const execd = us(t1);
  if (r.exitCode !== 0) {
    throw new Error(`exec true in ${s.id}: ${r.detail}`);
  }
  const t2 = process.hrtime.bigint();
  await s.remove({ force: true });
  const removed = us(t2);
  return `${us(t0)} ${s.id} ${created} ${execd} ${removed}`;
}

let filesSession: Session | undefined;
const blobs = new Map<number, Uint8Array>();

async function files(size: number): Promise<string> {
  filesSession ??= await roost.sessions.create({ capsule });
  let data = blobs.get(size);
  if (data === undefined) {
    data = new Uint8Array(size);
    for (let i = 0; i < size; i++) {
      data[i] = i % 251;
    }
    blobs.set(size, data);
  }
  const t0 = process.hrtime.bigint();
  await filesSession.files.write("blob", data);
  const wrote = us(t0);
  const t1 = process.hrtime.bigint();
  const back = await filesSession.files.readBytes("blob");
  const read = us(t1);
  if (back.length !== size || Buffer.compare(Buffer.from(back.buffer, back.byteOffset, back.length), Buffer.from(data.buffer)) !== 0) {
    throw new Error(`read back ${back.length} bytes of the ${size} written, or other bytes`);
  }
  return `${wrote} ${read}`;
}

for await (const line of createInterface({ input: process.stdin })) {
  const [what, arg] = line.trim().split(/\s+/);
  let out: string;
  try {
    if (what === "rt") {
      out = await roundTrip();
    } else if (what === "files" && /^\d+$/.test(arg ?? "")) {
      out = await files(Number(arg));
    } else {
      out = `error: ${JSON.stringify(line)}: not "rt" or "files BYTES"`;
    }
  } catch (err) {
    out = `error: ${(err as Error).message.replace(/\n/g, " ")}`;
  }
  process.stdout.write(out + "\n");
}
await filesSession?.remove({ force: true }).catch(() => {});
roost.close();
