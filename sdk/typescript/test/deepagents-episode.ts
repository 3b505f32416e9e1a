// A deepagents agent whose backend is a roost session: run by test/e2e/deepagents_test.go,
// which starts roostd, the session (ROOST_SESSION, on ROOST_SOCKET) and the scripted model
// behind the session's gateway, and checks what this prints (the workdir it was told, the
// tools' results and the agent's last answer, one JSON line each) against what the
// session's workdir holds.
import { ChatAnthropic } from "@langchain/anthropic";
import { ToolMessage } from "@langchain/core/messages";
import { createDeepAgent } from "deepagents";
import { Roost } from "../src/index.js";
import { RoostSandbox } from "../src/deepagents.js";

function env(name: string): string {
  const v = process.env[name];
  if (!v) {
    throw new Error(`deepagents-episode: $${name} is not set`);
  }
  return v;
}

const roost = Roost.connect({ socket: env("ROOST_SOCKET") });
try {
  const session = await roost.sessions.get(env("ROOST_SESSION"));
  const sandbox = new RoostSandbox(session, { timeout: 60 });
  console.log(JSON.stringify({ workdir: sandbox.workdir }));
  // The model client is the session's: its gateway's URL and its credential, which the
  // session's environment holds (inference.upstream), so roost meters the agent's calls.
  const gw = await session.exec(`printf '%s\\n' "$ANTHROPIC_BASE_URL" "$ANTHROPIC_API_KEY"`);
  const [url, key] = gw.stdout.split("\n");
  if (gw.exitCode !== 0 || !url || !key) {
    throw new Error(`deepagents-episode: the session's gateway environment: ${JSON.stringify(gw)}`);
  }
  const model = new ChatAnthropic({ model: "claude-test", anthropicApiUrl: url, apiKey: key, maxRetries: 0 });
  const agent = createDeepAgent({ model, backend: sandbox });
  const result = await agent.invoke({
    messages: [{ role: "user", content: `Work in ${sandbox.workdir}: write notes.txt and count its words.` }],
  });
  for (const m of result.messages) {
    if (m instanceof ToolMessage) {
      console.log(JSON.stringify({ tool: m.name, content: m.content }));
    }
  }
  const last = result.messages[result.messages.length - 1];
  console.log(JSON.stringify({ final: last.content }));
} finally {
  roost.close();
}
