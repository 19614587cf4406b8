// The TypeScript SDK's client calling one tool through toolsearch's call_tool with a progress
// callback, as an application would: prints the result and the progress reports as JSON.
//
//   node resuming-client.mjs MCP_URL TOOL PARAMETERS_JSON
//
// Its transport resumes a call's stream with Last-Event-ID when the stream ends before the result
// (it received a priming event with an id), which is what the test that runs it is about.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, tool, parameters] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url));
const client = new Client({ name: "resuming-client", version: "1.0.0" }, { capabilities: {} });
await client.connect(transport);
const progress = [];
const result = await client.callTool(
  { name: "call_tool", arguments: { tool_name: tool, parameters: JSON.parse(parameters) } },
  undefined,
  { onprogress: (report) => progress.push(report.progress), timeout: 60_000 },
);
console.log(JSON.stringify({ result, progress, protocol: transport.protocolVersion }));
await client.close();
