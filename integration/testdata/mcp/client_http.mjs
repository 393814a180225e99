// The official MCP TypeScript client over streamable HTTP: argv is the
// server's URL and its bearer token. It prints what each step returned.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token] = process.argv.slice(2);
const out = {};
try {
  const c = new Client({ name: "flmbox-integration-test", version: "1.0.0" });
  await c.connect(new StreamableHTTPClientTransport(new URL(url)));
  out.noToken = "connected";
} catch (e) {
  out.noToken = String(e);
}
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: `Bearer ${token}` } } });
const client = new Client({ name: "flmbox-integration-test", version: "1.0.0" });
await client.connect(transport);
out.once = await client.callTool({ name: "run_code", arguments: { code: "print(6*7)" } });
out.session = (await client.callTool({ name: "create_session", arguments: {} })).structuredContent?.session;
out.inSession = await client.callTool({ name: "run_code", arguments: { session: out.session, language: "shell", code: "echo $HOME" } });
// Another client neither sees nor reaches the first one's session.
const otherTransport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: `Bearer ${token}` } } });
const other = new Client({ name: "flmbox-integration-test-2", version: "1.0.0" });
await other.connect(otherTransport);
out.otherList = await other.callTool({ name: "list_sessions", arguments: {} });
out.otherRun = await other.callTool({ name: "run_code", arguments: { session: out.session, code: "print(1)" } });
out.otherEnd = await other.callTool({ name: "end_session", arguments: { session: out.session } });
await otherTransport.terminateSession();
await other.close();
// The client ends its MCP session: the server removes its sessions.
await transport.terminateSession();
await client.close();
console.log(JSON.stringify(out));
