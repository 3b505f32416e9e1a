// An OpenAI Agents SDK SandboxAgent run whose sandbox is a roost session: run by
// test/e2e/openai_agents_test.go, which starts roostd (ROOST_SOCKET) and the scripted model
// behind the gateway of the capsule's sessions (ROOST_CAPSULE), and checks what this prints
// (the session, each tool's result and the run's final output, one JSON line each) against
// what the session's workdir, record and spend hold.
import { OpenAIProvider, Runner, type RunItem } from "@openai/agents";
import { SandboxAgent } from "@openai/agents/sandbox";
import { Roost } from "../src/index.js";
import { RoostSandboxClient } from "../src/openai-agents.js";

function env(name: string): string {
  const v = process.env[name];
  if (!v) {
    throw new Error(`openai-agents-episode: $${name} is not set`);
  }
  return v;
}

const roost = Roost.connect({ socket: env("ROOST_SOCKET") });
try {
  const client = new RoostSandboxClient(roost, { capsule: env("ROOST_CAPSULE"), labels: { via: "openai-agents" }, timeout: 60 });
  const session = await client.create({ manifest: { entries: { "README.md": { type: "file", content: "notes go in notes.txt\n" } } } });
  console.log(JSON.stringify({ session: session.session.id, root: session.root }));
  // The model client is the session's: its gateway's URL and its credential, which the
  // session's environment holds (inference.upstream), so roost meters the agent's calls.
  const gw = await session.exec({ cmd: `printf '%s\\n' "$OPENAI_BASE_URL" "$OPENAI_API_KEY"` });
  const [baseURL, apiKey] = gw.stdout.split("\n");
  if (gw.exitCode !== 0 || !baseURL || !apiKey) {
    throw new Error(`openai-agents-episode: the session's gateway environment: ${JSON.stringify(gw)}`);
  }
  // Tracing would export the run to OpenAI's own API: off.
  const runner = new Runner({ modelProvider: new OpenAIProvider({ baseURL, apiKey, useResponses: true }), tracingDisabled: true });
  const agent = new SandboxAgent({ name: "roost-notes", model: "gpt-test", instructions: "Keep notes in the workspace." });
  try {
    const result = await runner.run(agent, "Write notes.txt and count its words.", { sandbox: { client, session } });
    for (const item of result.newItems) {
      report(item);
    }
    console.log(JSON.stringify({ final: result.finalOutput }));
  } finally {
    // The session was the episode's to give the run, so it is the episode's to end.
    await session.close();
  }
} finally {
  roost.close();
}

// report prints a tool's result: its name and what the model was given.
function report(item: RunItem): void {
  const raw = item.rawItem as { type: string; name?: string; output?: unknown };
  if (raw.type === "function_call_result") {
    const out = raw.output as { type?: string; text?: string } | string;
    console.log(JSON.stringify({ tool: raw.name, output: typeof out === "string" ? out : (out.text ?? JSON.stringify(out)) }));
  } else if (raw.type === "apply_patch_call_output") {
    console.log(JSON.stringify({ tool: "apply_patch", output: raw.output ?? "" }));
  }
}
