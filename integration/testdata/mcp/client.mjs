// The official MCP TypeScript client, driving `flmbox mcp` over stdio as an
// agent's config starts it: argv is the flmbox binary, then flmbox's
// arguments. It prints what every step returned, as one JSON object.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = process.argv.slice(2);
const transport = new StdioClientTransport({ command, args, stderr: "inherit" });
const client = new Client({ name: "flmbox-integration-test", version: "1.0.0" });
await client.connect(transport);
const call = (name, args) => client.callTool({ name, arguments: args });
const out = {};
out.tools = (await client.listTools()).tools.map((t) => ({ name: t.name, description: t.description, input: t.inputSchema, output: t.outputSchema }));
out.once = await call("run_code", { code: "print(6*7)" });
out.shell = await call("run_code", { language: "shell", code: "echo hi >&2; exit 3" });
const s = await call("create_session", {});
out.session = s;
const sid = s.structuredContent?.session;
out.write = await call("run_code", { session: sid, code: "open('/tmp/x', 'w').write('kept')" });
out.read = await call("run_code", { session: sid, code: "print(open('/tmp/x').read())" });
out.writeText = await call("write_file", { session: sid, path: "/tmp/notes.txt", content: "héllo\n" });
out.writeBinary = await call("write_file", { session: sid, path: "/tmp/blob.bin", content: Buffer.from([0, 255, 1, 254]).toString("base64"), encoding: "base64" });
out.readText = await call("read_file", { session: sid, path: "/tmp/notes.txt" });
out.readBinary = await call("read_file", { session: sid, path: "/tmp/blob.bin" });
out.listed = await call("list_files", { session: sid });
out.outside = await call("write_file", { session: sid, path: "/etc/passwd", content: "x" });
// A call that draws: the PNG it writes in images_dir comes back as an image.
out.plot = await call("run_code", { session: sid, images_dir: "/tmp/plots", code: [
  "import base64",
  "png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==')",
  "open('/tmp/plots/dot.png', 'wb').write(png)",
  "print('drawn')",
].join("\n") });
out.install = await call("install_packages", { session: sid, packages: ["flmbox-mcp-wheel==1.0"] });
out.imported = await call("run_code", { session: sid, code: "import flmbox_mcp_wheel; print(flmbox_mcp_wheel.GREETING)" });
out.installMissing = await call("install_packages", { session: sid, packages: ["no-such-package"] });
out.installBad = await call("install_packages", { session: sid, packages: ["--index-url=http://evil.example/"] });
out.second = await call("create_session", {});
out.list = await call("list_sessions", {});
out.badSession = await call("run_code", { session: "mcp-000000000000", code: "1" });
out.badLanguage = await call("run_code", { language: "ruby", code: "1" });
out.timeout = await call("run_code", { code: "import time; time.sleep(30)", timeout_seconds: 1 });
// Progress, then cancellation: the client aborts after two progress
// notifications; the code's process goes (the next call in the session
// polls for it for 30 s, half the server's --timeout), and the session
// serves that call.
const progress = [];
const ac = new AbortController();
const t0 = Date.now();
try {
  await client.callTool({ name: "run_code", arguments: { session: sid, code: "import os, time\nopen('/tmp/pid', 'w').write(str(os.getpid()))\ntime.sleep(600)" } },
    undefined, { signal: ac.signal, timeout: 120000, onprogress: (p) => { progress.push(p); if (progress.length === 2) ac.abort(); } });
  out.cancelled = "the call finished";
} catch (e) {
  out.cancelled = String(e);
}
out.cancelledAfterMS = Date.now() - t0;
out.progress = progress;
out.afterCancel = await call("run_code", { session: sid, code: [
  "import os, time",
  "pid = int(open('/tmp/pid').read())",
  "for _ in range(300):",
  "    try:",
  "        os.kill(pid, 0)",
  "    except ProcessLookupError:",
  "        print('stopped')",
  "        break",
  "    time.sleep(0.1)",
  "else:",
  "    print('still running')",
].join("\n") });
out.end = await call("end_session", { session: sid });
out.listAfter = await call("list_sessions", {});
// One left open: the server removes it when the client goes.
out.left = (await call("create_session", {})).structuredContent?.session;
await client.close();
console.log(JSON.stringify(out));
