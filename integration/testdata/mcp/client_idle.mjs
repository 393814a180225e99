// A session left idle: argv is the flmbox binary, then flmbox's arguments
// (with --session-idle). It prints the session and whether list_sessions
// lost it within a minute.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = process.argv.slice(2);
const client = new Client({ name: "flmbox-integration-test", version: "1.0.0" });
await client.connect(new StdioClientTransport({ command, args, stderr: "inherit" }));
const session = (await client.callTool({ name: "create_session", arguments: {} })).structuredContent?.session;
let gone = false;
for (const deadline = Date.now() + 60000; Date.now() < deadline; ) {
  const list = (await client.callTool({ name: "list_sessions", arguments: {} })).structuredContent?.sessions ?? [];
  if (!list.includes(session)) {
    gone = true;
    break;
  }
  await new Promise((r) => setTimeout(r, 250));
}
const after = await client.callTool({ name: "run_code", arguments: { session, code: "print(1)" } });
await client.close();
console.log(JSON.stringify({ session, gone, after }));
