// A session from a capsule directory, a file and a few commands in it, then its end. Run from the
// repository's root, with roostd running (make build && sudo bin/roostd):
//
//   cd sdk/typescript && npm ci && npx tsc -p . && cd ../.. &&
//     node sdk/typescript/dist/examples/hello.js [CAPSULE]
//
// CAPSULE is a capsule directory or a pushed name@version; sdk/examples/sandbox by default.
// ROOST_SOCKET names another socket than /run/roost/roostd.sock.
import { Roost, RoostError } from "../src/index.js";

const roost = Roost.connect();
try {
  const s = await roost.sessions.create({ capsule: process.argv[2] ?? "sdk/examples/sandbox" });
  console.log(`session ${s.id}: ${s.state}, ${s.record.containment?.achieved}`);

  const r = await s.exec("echo hello from $(uname -n) in $(pwd); ls -a", { timeout: 10_000 });
  console.log(`exit ${r.exitCode}:\n${r.stdout}`);

  await s.files.write("task.txt", "count these words\n");
  const wc = await s.exec("cat task.txt");
  console.log(`task.txt in the session: ${wc.stdout.trim()}`);

  const refused = await s.exec(["/usr/bin/id"]);
  console.log(`id: exit ${refused.exitCode}: ${refused.detail}`);

  await s.kill();
  console.log(`ended: ${(await s.wait()).detail}`);
  await s.remove();
} catch (err) {
  if (err instanceof RoostError) {
    console.error(`${err.name}: ${err.message}`);
    process.exitCode = 1;
  } else {
    throw err;
  }
} finally {
  roost.close();
}
